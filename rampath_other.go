//go:build !linux

package zinf

// ramFilesystem reports no RAM filesystem where statfs does not tell.
func ramFilesystem(dir string) string { return "" }

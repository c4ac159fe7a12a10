//go:build !linux

package zgomlx

// dropPages does nothing here (see pages_linux.go).
func dropPages([]byte) {}

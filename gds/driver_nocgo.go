//go:build !cgo

package gds

// loadCuFile fails: loading a C library at run time needs cgo.
func loadCuFile(string) (cufile, error) { return nil, errNoCgo }

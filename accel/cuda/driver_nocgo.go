//go:build !cgo

package cuda

// loadDriver fails: loading a C library at run time needs cgo.
func loadDriver(string) (driver, error) { return nil, errNoCgo }

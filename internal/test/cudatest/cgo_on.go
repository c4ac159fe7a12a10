//go:build cgo

package cudatest

// CgoEnabled reports whether the binary was built with cgo.
const CgoEnabled = true

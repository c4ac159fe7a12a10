//go:build !amd64

package vec

// plusZeroNTBytes is the amd64 kernel's streaming size; the lengths of
// TestAddKernelsMatchScalar go around it on every architecture.
const plusZeroNTBytes = 1 << 20

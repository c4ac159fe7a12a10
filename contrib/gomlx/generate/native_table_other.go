//go:build !unix

package generate

// sparseTable is n bytes of zeros (on the Go heap where there is no
// anonymous mapping).
func sparseTable(n int) ([]byte, func() error, error) {
	return make([]byte, n), func() error { return nil }, nil
}

//go:build unix

package generate

import "syscall"

// sparseTable is n bytes of zeros whose pages take memory only once
// written (an anonymous private mapping), for the native decoder's token
// embedding of which only the rows of the tokens are read.
func sparseTable(n int) ([]byte, func() error, error) {
	b, err := syscall.Mmap(-1, 0, n, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_PRIVATE|syscall.MAP_ANON)
	if err != nil {
		return nil, nil, err
	}
	return b, func() error { return syscall.Munmap(b) }, nil
}

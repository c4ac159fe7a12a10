//go:build !linux

package aio

import "fmt"

// newLibaioRing fails: kernel AIO (io_setup and friends) exists only on
// Linux.
func newLibaioRing(int) (ring, error) { return nil, libaioAvailable() }

// libaioAvailable reports that kernel AIO exists only on Linux.
func libaioAvailable() error {
	return fmt.Errorf("%w: libaio: Linux kernel AIO exists only on Linux", ErrUnavailable)
}

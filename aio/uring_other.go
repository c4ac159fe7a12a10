//go:build !linux

package aio

import "fmt"

// uringNeedsLockedThread: there is no io_uring here, so no thread affinity.
const uringNeedsLockedThread = false

// newUringRing fails: io_uring exists only on Linux.
func newUringRing(entries int) (ring, error) { return nil, uringAvailable() }

// uringAvailable reports that io_uring exists only on Linux.
func uringAvailable() error {
	return fmt.Errorf("%w: io_uring exists only on Linux", ErrUnavailable)
}

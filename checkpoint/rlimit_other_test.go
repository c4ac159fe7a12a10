//go:build !linux

package checkpoint

import "errors"

// limitAddressSpace is not wired up here: the memory-bounded tests skip.
func limitAddressSpace(extra uint64) error {
	return errors.New("no address-space limit on this platform")
}

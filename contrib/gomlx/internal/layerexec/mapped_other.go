//go:build !linux

package layerexec

import "errors"

// mapAnon is not used here: NewMappedBuffer falls back to NewBuffer.
func mapAnon(int) ([]byte, error) { return nil, errors.New("no anonymous mappings on this platform") }

// unmapAnon does nothing here.
func unmapAnon([]byte) error { return nil }

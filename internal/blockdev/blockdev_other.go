//go:build !linux

package blockdev

import (
	"errors"
	"fmt"
)

func of(path string) (Device, error) {
	return Device{}, fmt.Errorf("%w %s (finding it is implemented on Linux only)", ErrNoDevice, path)
}

func readStat(name string) (Stat, error) {
	return Stat{}, errors.New("blockdev: disk counters are read on Linux only")
}

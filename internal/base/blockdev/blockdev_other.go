//go:build !linux

package blockdev

import (
	"errors"
	"fmt"
	"time"
)

func of(path string) (Device, error) {
	return Device{}, fmt.Errorf("%w %s (finding it is implemented on Linux only)", ErrNoDevice, path)
}

func readStat(name string) (Stat, error) {
	return Stat{}, errors.New("blockdev: disk counters are read on Linux only")
}

func processIO() (Stat, error) {
	return Stat{}, errors.New("blockdev: a process's I/O counters are read on Linux only")
}

func uptime() (time.Duration, error) {
	return 0, errors.New("blockdev: uptime is read on Linux only")
}

package gds

import (
	"fmt"
	"sync"
)

// cufile is the subset of the cuFile API zinf calls. Handles and device
// pointers are carried as uintptr: they point into the driver's or the
// GPU's memory, never the Go heap. The calls that touch device memory must
// run with the device's CUDA context current (cuda.Device.WithContext).
//
// The cgo build implements it over the library loaded with dlopen; a build
// without cgo has no implementation (loadCuFile fails).
type cufile interface {
	path() string
	// hasBatch reports whether the library exports the batch API
	// (cuFileBatchIOSetUp and friends); zinf does not use it yet.
	hasBatch() bool
	driverOpen() error
	driverClose() error
	handleRegister(fd int) (uintptr, error)
	handleDeregister(h uintptr)
	bufRegister(p uintptr, n int64) error
	bufDeregister(p uintptr) error
	// read and write return bytes moved or an error from ioResult.
	read(h, base uintptr, size, fileOff, devOff int64) (int64, error)
	write(h, base uintptr, size, fileOff, devOff int64) (int64, error)
}

// The cuFile driver is process-wide: cuFileDriverOpen is called when the
// first user of a library (an Engine, or Available) needs it and
// cuFileDriverClose when the last lets go, so one user never closes the
// driver under another.
var (
	driverMu   sync.Mutex
	driverRefs = map[cufile]int{}
)

func acquireDriver(cf cufile) error {
	driverMu.Lock()
	defer driverMu.Unlock()
	if driverRefs[cf] == 0 {
		if err := cf.driverOpen(); err != nil {
			return err
		}
	}
	driverRefs[cf]++
	return nil
}

func releaseDriver(cf cufile) error {
	driverMu.Lock()
	defer driverMu.Unlock()
	switch driverRefs[cf] {
	case 0:
		return fmt.Errorf("gds: cuFile driver of %s released more often than acquired", cf.path())
	case 1:
		delete(driverRefs, cf)
		return cf.driverClose()
	}
	driverRefs[cf]--
	return nil
}

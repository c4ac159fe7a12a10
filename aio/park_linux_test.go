package aio

import (
	"errors"
	"path/filepath"
	"runtime"
	"slices"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// checkSignalEndsPark compares the waits of one 4 KiB direct read at a
// time on a ring that parks on its eventfd (parked) and on one that blocks
// in the kernel (blocking), in alternating rounds: where the kernel's
// signal, not the deadline, ends a park, the parked median stays within
// parkMax/2 of the blocking one (a park ended by its deadline costs
// parkMax). The parks-per-operation count of the tests above cannot tell
// the two apart: a park that ran to its deadline and then found the
// completion counts one as well.
func checkSignalEndsPark(t *testing.T, parked, blocking ring, fd int, buf []byte) {
	t.Helper()
	comps := make([]completion, 1)
	read := func(r ring, d *[]time.Duration) {
		for range 25 {
			t0 := time.Now()
			r.prep(OpRead, fdTarget(fd), buf, 0, 0)
			if err := r.submit(); err != nil {
				t.Fatal(err)
			}
			if n, err := r.wait(1, comps); err != nil || n != 1 || comps[0].res != int32(len(buf)) {
				t.Fatalf("%d completions (%v), %v", n, comps[:n], err)
			}
			*d = append(*d, time.Since(t0))
		}
	}
	var dp, db []time.Duration
	for round := range 8 {
		if round%2 == 0 {
			read(parked, &dp)
			read(blocking, &db)
		} else {
			read(blocking, &db)
			read(parked, &dp)
		}
	}
	slices.Sort(dp)
	slices.Sort(db)
	mp, mb := dp[len(dp)/2], db[len(db)/2]
	t.Logf("a 4 KiB direct read's wait, median: parked %v, blocking %v", mp, mb)
	if mp > mb+parkMax/2 {
		t.Errorf("parked waits' median %v against blocking waits' %v: the parks end at their deadline (%v), not on the kernel's signal", mp, mb, parkMax)
	}
}

// directFile opens a file of 4 KiB written with O_DIRECT in a temporary
// directory (skipping where the filesystem refuses O_DIRECT), and returns
// it with an aligned buffer of that size.
func directFile(t *testing.T) (int, []byte) {
	t.Helper()
	fd, err := unix.Open(filepath.Join(t.TempDir(), "signal"), unix.O_RDWR|unix.O_CREAT|unix.O_DIRECT|unix.O_CLOEXEC, 0o600)
	if err != nil {
		t.Skipf("O_DIRECT: %v", err)
	}
	t.Cleanup(func() { unix.Close(fd) })
	buf := alignedBuf(t, 4096)
	fillPattern(buf, 3)
	if _, err := unix.Pwrite(fd, buf, 0); err != nil {
		t.Fatal(err)
	}
	return fd, buf
}

func TestUringSignalEndsPark(t *testing.T) {
	// SINGLE_ISSUER: the rings are entered from this thread only.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	skipWithoutUring(t)
	fd, buf := directFile(t)
	for _, flags := range uringSetupTiers {
		parked, ok := openTier(t, flags)
		if !ok {
			continue
		}
		blocking, ok := openTier(t, flags)
		if !ok {
			t.Fatalf("flags %#x: refused the second time", flags)
		}
		blocking.evfd.drop()
		if !parked.evfd.ok() {
			t.Errorf("flags %#x: no eventfd", flags)
		} else {
			t.Logf("flags %#x:", flags)
			checkSignalEndsPark(t, parked, blocking, fd, buf)
		}
		if err := errors.Join(parked.close(), blocking.close()); err != nil {
			t.Fatal(err)
		}
	}
}

func TestLibaioSignalEndsPark(t *testing.T) {
	parked, blocking := libaioTestRing(t, 4), libaioTestRing(t, 4)
	blocking.evfd.drop()
	if !parked.evfd.ok() {
		t.Fatal("no eventfd")
	}
	fd, buf := directFile(t)
	checkSignalEndsPark(t, parked, blocking, fd, buf)
}

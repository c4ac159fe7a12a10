// Package probe measures a swap path's sequential read and write bandwidth
// through the aio engine, for the planner, and caches the result in the
// path so later runs reuse it.
//
// Measure writes and reads a private temporary file (created with O_EXCL,
// removed afterwards) in large O_DIRECT requests, several in flight, and
// times both directions; Bandwidth returns a cached figure for the path's
// filesystem when there is a fresh one and measures otherwise. The cache is
// a small JSON file (CacheName) in the swap path, keyed by the filesystem's
// device number and type, written atomically; an oversized or malformed
// cache file is ignored with a warning and never overwritten, since zinf
// cannot tell it made it.
//
// Caveats: a probe of tens of MiB finishes in a few hundred milliseconds on
// NVMe, short enough for the drive's write cache to flatter writes; it is a
// planning figure, not a benchmark (see `zinf io` for one). Where the
// filesystem refuses O_DIRECT the engine's buffered fallback is measured
// after the written pages are synced and dropped from the page cache; on a
// RAM-backed filesystem that is the speed of memory.
package probe

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"

	"github.com/zinfio/zinf/aio"
)

const (
	// DefaultBytes is the probe size when none is given: large enough to
	// pass a drive's first burst of queueing, small enough to take a few
	// hundred milliseconds on NVMe.
	DefaultBytes = 64 << 20
	// MinBytes and MaxBytes bound the probe size: below one request there
	// is nothing to time; above 4 GiB a "short" probe is no longer short.
	MinBytes = 1 << 20
	MaxBytes = 4 << 30
	// requestBytes is one request's size and inFlight how many are queued
	// at once: enough to keep an NVMe queue busy, as the swappers do.
	requestBytes = 1 << 20
	inFlight     = 8
)

// Measure writes then reads bytes (rounded up to whole 1 MiB requests;
// 0 means DefaultBytes) to a private temporary file in path through engine,
// and returns the read and write bandwidth in bytes per second. The write
// time includes the final sync, so a buffered fallback is not flattered by
// the page cache. The file is unnamed (O_TMPFILE) where the filesystem
// allows, so that even SIGKILL leaves nothing; elsewhere it is created
// with O_EXCL under a random name and removed whatever happens. Cancelling ctx stops the probe (after the
// requests in flight) and returns ctx's error.
func Measure(ctx context.Context, path string, engine aio.Engine, bytes int64) (readBps, writeBps float64, err error) {
	if engine == nil {
		return 0, 0, errors.New("probe: no I/O engine")
	}
	if bytes == 0 {
		bytes = DefaultBytes
	}
	if bytes < MinBytes || bytes > MaxBytes {
		return 0, 0, fmt.Errorf("probe: probe size %d bytes: want %d to %d", bytes, MinBytes, MaxBytes)
	}
	n := (bytes + requestBytes - 1) / requestBytes
	f, name, err := openProbeFile(engine, path)
	if err != nil {
		return 0, 0, err
	}
	defer func() {
		f.Close()
		if name != "" {
			os.Remove(name)
		}
	}()
	if int64(f.Alignment()) > requestBytes || requestBytes%f.Alignment() != 0 {
		return 0, 0, fmt.Errorf("probe: %s needs %d-byte alignment, which %d-byte requests do not keep", path, f.Alignment(), requestBytes)
	}
	// Page-aligned memory outside the Go heap, as O_DIRECT needs.
	buf, err := unix.Mmap(-1, 0, inFlight*requestBytes, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
	if err != nil {
		return 0, 0, fmt.Errorf("probe: mapping %d bytes of buffers: %w", inFlight*requestBytes, err)
	}
	defer unix.Munmap(buf)
	// Random bytes, so compressing or deduplicating storage moves them all.
	if _, err := rand.Read(buf); err != nil {
		return 0, 0, fmt.Errorf("probe: %w", err)
	}

	start := time.Now()
	if err := run(ctx, engine, f, aio.OpWrite, n, buf); err != nil {
		return 0, 0, err
	}
	if err := f.Sync(); err != nil {
		return 0, 0, fmt.Errorf("probe: syncing the probe file in %s: %w", path, err)
	}
	write := time.Since(start)
	if !f.Direct() {
		// Buffered: read from the device, not from the pages just written.
		dropCache(f.Fd())
	}
	start = time.Now()
	if err := run(ctx, engine, f, aio.OpRead, n, buf); err != nil {
		return 0, 0, err
	}
	read := time.Since(start)
	total := float64(n * requestBytes)
	return total / max(read.Seconds(), 1e-9), total / max(write.Seconds(), 1e-9), nil
}

// openProbeFile creates the probe's file in path: an unnamed one
// (O_TMPFILE) where the filesystem makes them, so that a process killed
// mid-probe leaves nothing behind; otherwise a file of a random name,
// created with O_EXCL, which name returns for removal.
func openProbeFile(engine aio.Engine, path string) (f *aio.File, name string, err error) {
	if tmpfileFlag != 0 {
		if f, err := engine.Open(path, os.O_RDWR|tmpfileFlag, 0o600); err == nil {
			return f, "", nil
		}
		// No O_TMPFILE here (or not with this policy): a named file.
	}
	var suffix [8]byte
	if _, err := rand.Read(suffix[:]); err != nil {
		return nil, "", fmt.Errorf("probe: %w", err)
	}
	name = filepath.Join(path, fmt.Sprintf(".zinf-bwprobe-%d-%s", os.Getpid(), hex.EncodeToString(suffix[:])))
	f, err = engine.Open(name, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		// A filesystem may create the file before refusing O_DIRECT.
		if !errors.Is(err, os.ErrExist) {
			os.Remove(name)
		}
		return nil, "", fmt.Errorf("probe: creating a probe file in %s: %w", path, err)
	}
	return f, name, nil
}

// run moves n requests of requestBytes at consecutive offsets, inFlight at
// a time, each slot of buf reused once its request is waited for.
func run(ctx context.Context, engine aio.Engine, f *aio.File, op aio.Op, n int64, buf []byte) error {
	reqs := make([]aio.Request, inFlight)
	busy := make([]bool, inFlight)
	var first error
	wait := func(k int) {
		if busy[k] {
			busy[k] = false
			if _, err := reqs[k].Wait(); err != nil && first == nil {
				first = fmt.Errorf("probe: %v at offset %d of %s: %w", op, reqs[k].Offset, f.Path(), err)
			}
		}
	}
	for i := int64(0); i < n && first == nil; i++ {
		k := int(i % inFlight)
		wait(k)
		if first != nil {
			break
		}
		if err := ctx.Err(); err != nil {
			first = fmt.Errorf("probe: %w", err)
			break
		}
		r := &reqs[k]
		r.Op, r.File, r.Offset, r.Buf = op, f, i*requestBytes, buf[k*requestBytes:(k+1)*requestBytes]
		if err := engine.Submit(&reqs[k]); err != nil {
			first = fmt.Errorf("probe: submitting a %v of %s: %w", op, f.Path(), err)
			break
		}
		busy[k] = true
	}
	for k := range reqs {
		wait(k) // nothing stays in flight, whatever failed
	}
	return first
}

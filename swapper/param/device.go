package param

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/zinfio/zinf/accel"
	"github.com/zinfio/zinf/gds"
)

// Device-resident swap-ins (Options.DeviceIO): DeepSpeed's use_gds for the
// partitioned parameter swapper. An NVMe partition is read from its swap
// files straight into a device allocation by a gds.DeviceIO (GPUDirect
// Storage, or the bounce path through pinned staging buffers), so the
// resident copy lives in device memory; ReadFloat32 copies it to the host
// through a pool staging buffer, as for TierGPU partitions.
//
// The store keeps a tensor's bytes in stripe chunks laid out over its
// paths; the swapper asks Store.Locate where each chunk is, merges chunks
// that are contiguous both in the file and in the partition (on a single
// path, the whole partition is one extent and one request), and reads the
// runs concurrently. Locate takes no reference on the version it reports:
// the swapper reads the generation first and an update that replaces the
// version drops the flight, so bytes from a version being replaced are
// discarded, never served.

// deviceAllocMaxBackoff bounds the wait between retries of a device
// allocation that found the device full while other partitions this
// swapper holds may still be released.
const deviceAllocMaxBackoff = 10 * time.Millisecond

// deviceFiles are the swap files opened for device reads, by path.
type deviceFiles struct {
	mu     sync.Mutex
	files  map[string]*gds.File
	closed bool
}

// file returns the swap file at path opened by dio (read-only), opening it
// on first use.
func (d *deviceFiles) file(dio gds.DeviceIO, path string) (*gds.File, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return nil, ErrClosed
	}
	if f, ok := d.files[path]; ok {
		return f, nil
	}
	f, err := dio.OpenFile(path, os.O_RDONLY, 0)
	if err != nil {
		return nil, err
	}
	if d.files == nil {
		d.files = make(map[string]*gds.File)
	}
	d.files[path] = f
	return f, nil
}

// close closes every file; requests still running on one finish first.
func (d *deviceFiles) close() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.closed = true
	var errs []error
	for _, f := range d.files {
		errs = append(errs, f.Close())
	}
	d.files = nil
	return errors.Join(errs...)
}

// flyDevice runs the I/O part of a device-resident swap-in: a device
// allocation of the padded partition, then reads from the swap files.
func (s *Swapper) flyDevice(t *tensor, f *flight) {
	padded := s.store.PaddedLen(int64(t.bytes))
	mem, err := s.deviceAlloc(f, padded)
	if err != nil {
		s.land(t, f, nil, 0, true, err)
		return
	}
	// The generation is read before the chunks are located (see fly).
	s.mu.Lock()
	f.stage = reading
	gen := t.gen
	s.mu.Unlock()
	if err := s.readToDevice(f.ctx, t.key, mem, padded); err != nil {
		if ferr := s.dev.Free(mem); ferr != nil {
			s.log.Error("param: freeing device memory after a failed swap-in", "tensor", t.name, "err", ferr)
		}
		s.mu.Lock()
		s.stats.SwapInErrors++
		s.mu.Unlock()
		s.land(t, f, nil, 0, true, err)
		return
	}
	s.mu.Lock()
	s.stats.SwapIns++
	s.stats.BytesRead += int64(t.bytes)
	s.mu.Unlock()
	s.land(t, f, deviceBlock(s.dev, mem, s.log), gen, true, nil)
}

// deviceAlloc allocates size bytes on the device for flight f. A full
// device is backpressure, not an error, while something this swapper
// holds may still make room: a waited-for swap-in first preempts a
// prefetched partition nobody has claimed, and otherwise the allocation is
// retried (with backoff) until a Release frees memory or f is cancelled.
// With nothing of this swapper's to wait for, a full device is an error
// that says how full.
func (s *Swapper) deviceAlloc(f *flight, size int64) (accel.Mem, error) {
	s.mu.Lock()
	f.stage = awaitingBuffer // device memory: no turn in the pool
	s.mu.Unlock()
	backoff := 100 * time.Microsecond
	for {
		m, err := s.dev.Alloc(size)
		if err == nil {
			return m, nil
		}
		if !errors.Is(err, accel.ErrOutOfMemory) {
			return nil, err
		}
		s.mu.Lock()
		preempted := f.demand && s.preemptOneLocked(false)
		others := s.deviceHeldLocked(f)
		s.mu.Unlock()
		if preempted {
			continue
		}
		if !others {
			return nil, fmt.Errorf("param: no room for a %d-byte partition on device %s (%d of %d bytes in use) and no swapped-in partition to wait for; lower buffer_count or give the GPU tier more memory: %w",
				size, s.dev.Name(), s.dev.UsedBytes(), s.dev.CapacityBytes(), err)
		}
		select {
		case <-f.ctx.Done():
			return nil, f.ctx.Err()
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, deviceAllocMaxBackoff)
	}
}

// deviceHeldLocked reports whether device memory this swapper holds may
// be given back later: a resident device copy (a Release frees it) or
// another swap-in that already has its allocation (it lands, then is
// released in turn).
func (s *Swapper) deviceHeldLocked(self *flight) bool {
	for _, t := range s.tensors {
		if t.res != nil && t.res.mem != nil {
			return true
		}
	}
	for f := range s.flights {
		if f != self && f.stage == reading {
			return true
		}
	}
	return false
}

// deviceRun is a range of a partition that is contiguous in one swap file.
type deviceRun struct {
	path            string
	fileOff, memOff int64
	n               int64
}

// deviceRuns lists where the padded bytes of key lie, merging stripe
// chunks contiguous in both the file and the partition.
func (s *Swapper) deviceRuns(key string, padded int64) ([]deviceRun, error) {
	stripe := s.store.StripeBytes()
	var runs []deviceRun
	for lo := int64(0); lo < padded; lo += stripe {
		// Every chunk starts before the logical end (stripes are multiples
		// of the alignment the padding rounds to), so Locate accepts lo.
		path, off, err := s.store.Locate(key, lo)
		if err != nil {
			return nil, err
		}
		n := min(stripe, padded-lo)
		if k := len(runs) - 1; k >= 0 && runs[k].path == path && runs[k].fileOff+runs[k].n == off && runs[k].memOff+runs[k].n == lo {
			runs[k].n += n
			continue
		}
		runs = append(runs, deviceRun{path: path, fileOff: off, memOff: lo, n: n})
	}
	return runs, nil
}

// readToDevice reads the padded bytes of key into mem, the runs
// concurrently (as many at once as the store has paths, at least two).
func (s *Swapper) readToDevice(ctx context.Context, key string, mem accel.Mem, padded int64) error {
	runs, err := s.deviceRuns(key, padded)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	sem := make(chan struct{}, max(len(s.store.Paths()), 2))
	var (
		wg    sync.WaitGroup
		errMu sync.Mutex
		first error
	)
	for _, r := range runs {
		f, err := s.dfiles.file(s.opts.DeviceIO, r.path)
		if err != nil {
			cancel()
			wg.Wait()
			return errors.Join(first, err)
		}
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			if _, err := s.opts.DeviceIO.ReadToDevice(ctx, f, mem, r.memOff, r.fileOff, r.n); err != nil {
				errMu.Lock()
				if first == nil {
					first = err
					cancel()
				}
				errMu.Unlock()
			}
		}()
	}
	wg.Wait()
	return first
}

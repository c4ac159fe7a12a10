package zinf

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"

	"github.com/zinfio/zinf/buffers"
	"github.com/zinfio/zinf/config"
	"github.com/zinfio/zinf/plan"
	"github.com/zinfio/zinf/swapper"
)

// DefaultActivationCPUBytes is the pinned memory of an activation tier
// when zinf.activations.cpu_bytes is 0.
const DefaultActivationCPUBytes = 64 << 20

// activationPrefetch is how many entries the nvme tier reads back ahead
// of the backward pass.
const activationPrefetch = 2

// Activations is a step's activation tier: the activations (or
// checkpointed layer inputs) a loop keeps between a layer's forward and
// its backward, handed to zinf with Save and taken back with Load. Each
// entry is kept, by zinf.activations, in memory while the entries fit
// memory_bytes, else in pinned memory while they fit cpu_bytes, else on
// NVMe — written behind, and read back ahead of the backward pass: after
// each Load the next entries a backward pass takes (the highest layer
// first, then its micro-batches in order, the order of both a layer-major
// and a micro-batch-major backward pass) are read into pinned memory.
//
// An NVMe write that fails keeps its pinned copy (nothing is lost) and is
// reported by the next Save, Load or Flush; the loop gives the step up
// (Runtime.AbortStep, Activations.Reset) and runs it again. For one loop
// goroutine; Stats is safe from any.
type Activations struct {
	rt     *Runtime
	device config.ActivationsDevice
	memMax int64 // auto: the memory budget, 0 = none

	pool *buffers.Pool // cpu tier and nvme staging
	// pinnedMax bounds the pool bytes the cpu tier's entries take (their
	// blocks): the pool less the nvme tier's staging; pinnedHeld is what
	// they take now.
	pinnedMax, pinnedHeld int64
	store                 *swapper.Store // nvme
	seq                   int
	ents                  map[[2]int]*actEntry
	err                   error // a failed write-behind, reported once

	mu     sync.Mutex
	stats  ActivationStats
	closed bool
}

// ActivationStats count an activation tier's entries and traffic.
type ActivationStats struct {
	// MemoryBytes, PinnedBytes and NVMeBytes are the entries held on each
	// tier now; the Peak figures their highest.
	MemoryBytes, PinnedBytes, NVMeBytes             int64
	PeakMemoryBytes, PeakPinnedBytes, PeakNVMeBytes int64
	// Saved and Loaded count entries; BytesWritten and BytesRead the NVMe
	// traffic; Prefetched the entries read back before their Load.
	Saved, Loaded             int64
	BytesWritten, BytesRead   int64
	Prefetched, WriteFailures int64
}

// actEntry is one saved activation.
type actEntry struct {
	layer, micro int
	seq          int
	n            int
	mem          []byte           // memory tier
	buf          *buffers.Buffer  // pinned: the cpu tier, or nvme staging (write in flight, read ahead)
	onDisk       bool             // nvme: written (or being written)
	pend         *swapper.Pending // a read ahead in flight
	// A write-behind in flight: wdone is closed when it is done, with
	// its outcome in werr (a goroutine waits for it, so that its staging
	// comes back as soon as it is written).
	wdone   chan struct{}
	werr    error
	writing bool
	failed  error // the write failed: buf keeps the bytes
}

// OpenActivations opens the activation tier zinf.activations describes.
// maxEntryBytes is the largest entry the loop will Save (it sizes the
// nvme tier's staging). Close it before the runtime.
func (r *Runtime) OpenActivations(maxEntryBytes int64) (a *Activations, err error) {
	if err := r.closedErr("open activations", nil); err != nil {
		return nil, err
	}
	ac := r.Config.Zinf.Activations
	if maxEntryBytes <= 0 || maxEntryBytes > 1<<40 {
		return nil, fmt.Errorf("zinf: activations: largest entry %d bytes (allowed: 1 byte to 1 TiB)", maxEntryBytes)
	}
	a = &Activations{rt: r, device: ac.Device, memMax: int64(ac.MemoryBytes), ents: map[[2]int]*actEntry{}}
	if a.device == "" {
		a.device = config.ActivationsAuto
	}
	if a.device == config.ActivationsAuto && r.Config.CPUCheckpointing {
		// DeepSpeed's activation_checkpointing.cpu_checkpointing: the
		// activations in CPU (pinned) memory.
		a.device = config.ActivationsCPU
	}
	// A refusal removes what was made (the swap store's run directory
	// included). The error returns set a to nil: close through a copy.
	made := a
	defer func() {
		if err != nil {
			made.Close()
			a = nil
		}
	}()
	if a.device == config.ActivationsMemory || a.device == config.ActivationsAuto && a.memMax == 0 {
		return a, nil
	}
	pinned := int64(ac.CPUBytes)
	if pinned == 0 {
		pinned = DefaultActivationCPUBytes
	}
	granule := plan.GranuleBytes()
	if a.device != config.ActivationsCPU {
		if len(r.Config.NVMePaths()) == 0 {
			if a.device == config.ActivationsNVMe {
				return nil, errors.New(`zinf: zinf.activations.device "nvme" needs an NVMe path (zinf.nvme_paths or an offload nvme_path)`)
			}
		} else {
			o := plan.StoreOptions(r.Config, r.Config.NVMePaths())
			o.Engine, o.Name, o.Logger = r.Engine, fmt.Sprintf("act-rank%d", r.Rank), r.log
			if a.store, err = swapper.OpenStore(o); err != nil {
				return nil, fmt.Errorf("zinf: activations swap store: %w", err)
			}
			granule = plan.GranuleBytes(a.store)
			// Staging: a write behind and the reads ahead, at the least.
			stage := int64(activationPrefetch+2) * buffers.SpanBytes(a.store.PaddedLen(maxEntryBytes), int(granule))
			if a.device == config.ActivationsNVMe && (ac.CPUBytes == 0 || pinned > stage) {
				pinned = stage // staging is all the nvme tier pins
			}
			if pinned < stage {
				if ac.CPUBytes != 0 {
					return nil, fmt.Errorf("zinf: zinf.activations.cpu_bytes = %s is too small for the nvme tier's staging: %d buffers of %s (entries up to %d bytes) need %s",
						ac.CPUBytes, activationPrefetch+2, config.Size(buffers.SpanBytes(a.store.PaddedLen(maxEntryBytes), int(granule))), maxEntryBytes, config.Size(stage))
				}
				pinned = stage
			}
		}
	}
	pinned = (pinned + granule - 1) / granule * granule
	a.pinnedMax = pinned
	if a.store != nil {
		a.pinnedMax -= int64(activationPrefetch+2) * buffers.SpanBytes(a.store.PaddedLen(maxEntryBytes), int(granule))
	}
	if a.pool, err = buffers.NewPool(buffers.Options{CapacityBytes: pinned, MinBufferBytes: int(granule), Logger: r.log}); err != nil {
		return nil, fmt.Errorf("zinf: activations pinned memory (zinf.activations.cpu_bytes = %s): %w", config.Size(pinned), err)
	}
	return a, nil
}

// Device is the tier setting the activations follow (zinf.activations.device).
func (a *Activations) Device() config.ActivationsDevice { return a.device }

// Stats returns the counters.
func (a *Activations) Stats() ActivationStats {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.stats
}

func (a *Activations) key(e *actEntry) string { return fmt.Sprintf("act-%d-%d", e.layer, e.micro) }

// account moves n bytes onto (n > 0) or off (n < 0) a tier's gauge.
func (a *Activations) account(tier *int64, peak *int64, n int64) {
	a.mu.Lock()
	*tier += n
	*peak = max(*peak, *tier)
	a.mu.Unlock()
}

// Save hands layer l's activations of micro-batch m to the tier: data is
// copied (the caller may reuse it when Save returns). An entry for (l, m)
// must not be held already. An error of an earlier write-behind is
// returned first (nothing of data is kept then).
func (a *Activations) Save(ctx context.Context, l, m int, data []byte) error {
	if err := a.check(ctx); err != nil {
		return err
	}
	k := [2]int{l, m}
	if _, dup := a.ents[k]; dup {
		return fmt.Errorf("zinf: activations: layer %d micro-batch %d saved twice (Load it first)", l, m)
	}
	e := &actEntry{layer: l, micro: m, seq: a.seq, n: len(data)}
	a.seq++
	n := int64(len(data))
	switch {
	case a.device == config.ActivationsMemory || a.device == config.ActivationsAuto && (a.memMax == 0 || a.stats.MemoryBytes+n <= a.memMax):
		e.mem = append([]byte(nil), data...)
		a.account(&a.stats.MemoryBytes, &a.stats.PeakMemoryBytes, n)
	case a.device != config.ActivationsNVMe && a.tryPinned(e, data):
	case a.device == config.ActivationsCPU:
		return fmt.Errorf("zinf: activations: layer %d micro-batch %d: %d bytes do not fit the pinned tier (zinf.activations.cpu_bytes; %s held)",
			l, m, n, config.Size(a.Stats().PinnedBytes))
	default:
		if err := a.saveNVMe(ctx, e, data); err != nil {
			return err
		}
	}
	a.ents[k] = e
	a.mu.Lock()
	a.stats.Saved++
	a.mu.Unlock()
	return nil
}

// tryPinned keeps e on the cpu tier when the pool has room.
func (a *Activations) tryPinned(e *actEntry, data []byte) bool {
	if a.pool == nil || len(data) == 0 {
		return false
	}
	block := buffers.SpanBytes(int64(len(data)), a.pool.MinBufferBytes())
	if a.pinnedHeld+block > a.pinnedMax {
		return false
	}
	b, ok := a.pool.TryAcquire(len(data), buffers.PurposeStaging)
	if !ok {
		return false
	}
	copy(b.Bytes(), data)
	e.buf = b
	a.pinnedHeld += block
	a.account(&a.stats.PinnedBytes, &a.stats.PeakPinnedBytes, int64(len(data)))
	return true
}

// staging takes a pinned buffer of n bytes for the nvme tier, finishing
// write-behinds (oldest first) until one fits.
func (a *Activations) staging(ctx context.Context, n int) (*buffers.Buffer, error) {
	for {
		if b, ok := a.pool.TryAcquire(n, buffers.PurposeStaging); ok {
			return b, nil
		}
		var oldest *actEntry
		for _, e := range a.ents {
			if e.writing && (oldest == nil || e.seq < oldest.seq) {
				oldest = e
			}
		}
		if oldest == nil {
			// Only entries nothing will release fill the pool (failed
			// writes kept for Load, reads ahead): waiting would be
			// forever.
			held := a.pool.Stats().InUseBytes
			return nil, fmt.Errorf("zinf: activations: no pinned staging for %d bytes: the tier's %s (zinf.activations.cpu_bytes) hold %s of entries whose writes failed or that were read ahead; give the step up (Reset)",
				n, config.Size(a.pool.Stats().CapacityBytes), config.Size(held))
		}
		a.finish(oldest, true)
		if err := a.takeErr(); err != nil {
			return nil, err
		}
	}
}

// saveNVMe writes e behind through a staging buffer.
func (a *Activations) saveNVMe(ctx context.Context, e *actEntry, data []byte) error {
	if a.store == nil {
		return fmt.Errorf("zinf: activations: layer %d micro-batch %d does not fit memory (zinf.activations.memory_bytes) or pinned memory, and there is no NVMe path", e.layer, e.micro)
	}
	if len(data) == 0 {
		e.onDisk = true
		return nil
	}
	b, err := a.staging(ctx, len(data))
	if err != nil {
		return err
	}
	copy(b.Bytes(), data)
	e.buf = b
	p, err := a.store.WriteAsync(a.key(e), b.Bytes()[:len(data)])
	if err != nil {
		b.Release()
		e.buf = nil
		return fmt.Errorf("zinf: activations: writing layer %d micro-batch %d: %w", e.layer, e.micro, err)
	}
	e.wdone, e.writing, e.onDisk = make(chan struct{}), true, true
	go func(done chan struct{}) {
		e.werr = p.Wait()
		close(done)
	}(e.wdone)
	a.account(&a.stats.NVMeBytes, &a.stats.PeakNVMeBytes, int64(len(data)))
	a.mu.Lock()
	a.stats.BytesWritten += int64(len(data))
	a.mu.Unlock()
	return nil
}

// finish waits for e's transfer. A finished write lets its staging go
// (release); a failed one keeps it and records the error. A failed read
// ahead lets its buffer go (the bytes are still on disk).
func (a *Activations) finish(e *actEntry, release bool) {
	if e.writing {
		<-e.wdone
		e.writing, e.wdone = false, nil
		switch {
		case e.werr != nil:
			e.failed = fmt.Errorf("zinf: activations: writing layer %d micro-batch %d behind: %w", e.layer, e.micro, e.werr)
			if a.err == nil {
				a.err = e.failed
			}
			a.mu.Lock()
			a.stats.WriteFailures++
			a.mu.Unlock()
		case release:
			e.buf.Release()
			e.buf = nil
		}
		return
	}
	if e.pend == nil {
		return
	}
	err := e.pend.Wait()
	e.pend = nil
	if err != nil {
		e.buf.Release()
		e.buf = nil
	}
}

// reap finishes the write-behinds that are done, giving their staging
// back.
func (a *Activations) reap() {
	for _, e := range a.ents {
		if !e.writing {
			continue
		}
		select {
		case <-e.wdone:
			a.finish(e, true)
		default:
		}
	}
}

func (a *Activations) takeErr() error {
	err := a.err
	a.err = nil
	return err
}

// check refuses a closed tier and reports a failed write-behind.
func (a *Activations) check(ctx context.Context) error {
	if a.closed {
		return errors.New("zinf: activations: closed")
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	a.reap()
	return a.takeErr()
}

// Load copies layer l's activations of micro-batch m into dst (at least
// as long as what was saved) and forgets the entry; it returns the bytes
// copied. On NVMe it waits for the entry's read (started ahead, or now)
// and reads the next entries of the backward pass ahead.
func (a *Activations) Load(ctx context.Context, l, m int, dst []byte) (int, error) {
	if err := a.check(ctx); err != nil {
		return 0, err
	}
	k := [2]int{l, m}
	e, ok := a.ents[k]
	if !ok {
		return 0, fmt.Errorf("zinf: activations: layer %d micro-batch %d was not saved", l, m)
	}
	if len(dst) < e.n {
		return 0, fmt.Errorf("zinf: activations: layer %d micro-batch %d: %d bytes saved, %d in the destination", l, m, e.n, len(dst))
	}
	switch {
	case e.mem != nil || e.n == 0:
		copy(dst, e.mem)
		a.account(&a.stats.MemoryBytes, &a.stats.PeakMemoryBytes, -int64(len(e.mem)))
	case !e.onDisk:
		copy(dst, e.buf.Bytes()[:e.n])
		e.buf.Release()
		a.pinnedHeld -= buffers.SpanBytes(int64(e.n), a.pool.MinBufferBytes())
		a.account(&a.stats.PinnedBytes, &a.stats.PeakPinnedBytes, -int64(e.n))
	default:
		// A write in flight, or a read ahead: its buffer has the bytes
		// once it is done. A failed write keeps them, and is reported now:
		// the step is given up (Reset drops the entry).
		a.finish(e, false)
		if err := a.takeErr(); err != nil {
			return 0, err
		}
		if e.buf == nil {
			b, err := a.staging(ctx, e.n)
			if err != nil {
				return 0, err
			}
			p, err := a.store.ReadAsync(a.key(e), b.Bytes()[:e.n])
			if err == nil {
				err = p.Wait()
			}
			if err != nil {
				b.Release()
				return 0, fmt.Errorf("zinf: activations: reading layer %d micro-batch %d back: %w", l, m, err)
			}
			e.buf = b
			a.mu.Lock()
			a.stats.BytesRead += int64(e.n)
			a.mu.Unlock()
		}
		copy(dst, e.buf.Bytes()[:e.n])
		e.buf.Release()
		a.store.Delete(a.key(e))
		a.account(&a.stats.NVMeBytes, &a.stats.PeakNVMeBytes, -int64(e.n))
	}
	delete(a.ents, k)
	a.mu.Lock()
	a.stats.Loaded++
	a.mu.Unlock()
	a.prefetch()
	return e.n, nil
}

// prefetch reads back the next entries of a backward pass that are only
// on NVMe, within the staging the pool spares.
func (a *Activations) prefetch() {
	if a.store == nil {
		return
	}
	var next []*actEntry
	for _, e := range a.ents {
		if e.onDisk && e.buf == nil && e.n > 0 {
			next = append(next, e)
		}
	}
	slices.SortFunc(next, func(x, y *actEntry) int {
		if c := cmp.Compare(y.layer, x.layer); c != 0 {
			return c
		}
		return cmp.Compare(x.micro, y.micro)
	})
	ahead := 0
	for _, e := range a.ents {
		if e.pend != nil {
			ahead++
		}
	}
	for _, e := range next {
		if ahead >= activationPrefetch {
			return
		}
		b, ok := a.pool.TryAcquire(e.n, buffers.PurposeStaging)
		if !ok {
			return
		}
		p, err := a.store.ReadAsync(a.key(e), b.Bytes()[:e.n])
		if err != nil {
			b.Release()
			return // Load reads it itself, and reports
		}
		e.buf, e.pend = b, p
		ahead++
		a.mu.Lock()
		a.stats.BytesRead += int64(e.n)
		a.stats.Prefetched++
		a.mu.Unlock()
	}
}

// Flush waits for every write-behind and returns the first failure (the
// entries stay, in pinned memory where their write failed).
func (a *Activations) Flush(ctx context.Context) error {
	if a.closed {
		return errors.New("zinf: activations: closed")
	}
	for _, e := range a.ents {
		if e.writing {
			a.finish(e, true)
		}
	}
	return a.takeErr()
}

// Reset forgets every entry (a step given up, or done): transfers in
// flight are waited for, pinned memory given back, swap space freed.
func (a *Activations) Reset() {
	for k, e := range a.ents {
		a.drop(e)
		delete(a.ents, k)
	}
	a.err = nil
}

func (a *Activations) drop(e *actEntry) {
	if e.writing {
		<-e.wdone
		e.writing = false
	}
	if e.pend != nil {
		_ = e.pend.Wait()
		e.pend = nil
	}
	n := int64(e.n)
	switch {
	case e.mem != nil || e.n == 0:
		a.account(&a.stats.MemoryBytes, &a.stats.PeakMemoryBytes, -int64(len(e.mem)))
	case !e.onDisk:
		a.pinnedHeld -= buffers.SpanBytes(n, a.pool.MinBufferBytes())
		a.account(&a.stats.PinnedBytes, &a.stats.PeakPinnedBytes, -n)
	default:
		a.account(&a.stats.NVMeBytes, &a.stats.PeakNVMeBytes, -n)
		a.store.Delete(a.key(e))
	}
	if e.buf != nil {
		e.buf.Release()
		e.buf = nil
	}
}

// Close forgets every entry, frees the pinned memory and removes the swap
// files. It is idempotent.
func (a *Activations) Close() error {
	if a == nil || a.closed {
		return nil
	}
	a.Reset()
	a.closed = true
	var errs []error
	if a.store != nil {
		errs = append(errs, a.store.Close())
	}
	if a.pool != nil {
		errs = append(errs, a.pool.Close())
	}
	return errors.Join(errs...)
}

package param

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	ztensor "github.com/zinfio/zinf/tensor"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dgraph-io/ristretto/v2"

	"github.com/zinfio/zinf/accel"
	"github.com/zinfio/zinf/buffers"
	"github.com/zinfio/zinf/internal/base/yield"
	"github.com/zinfio/zinf/swapper"
)

// Sentinel errors; test with errors.Is.
var (
	// ErrClosed: the swapper was closed.
	ErrClosed = ztensor.ClosedError("param: swapper closed")
	// ErrUnknown: no tensor of that name was registered.
	ErrUnknown = errors.New("param: tensor not registered")
	// ErrNotInitialized: the tensor was registered but never given values
	// (Init, or a committed update).
	ErrNotInitialized = errors.New("param: tensor not initialized")
	// ErrNotResident: ReadFloat32 of an NVMe partition that is neither
	// resident, in flight nor cached: Prefetch or SwapIn it first.
	ErrNotResident = errors.New("param: partition not swapped in")
	// ErrNotInMemory: Snapshot of an NVMe-tier partition, which lives in
	// the store (pin the store's version instead: swapper.Store.Pin).
	ErrNotInMemory = errors.New("param: partition not kept in memory")
)

// State is where an NVMe partition is now. CPU and GPU tier partitions are
// always Resident.
type State int

const (
	// Unknown: no tensor of that name is registered.
	Unknown State = iota
	// Resident: in a pinned buffer (or, for CPU/GPU tiers, in its tier).
	Resident
	// OnNVMe: only on NVMe (possibly in the CPU cache).
	OnNVMe
	// InFlight: a swap-in was requested and has not finished.
	InFlight
)

// String returns "resident", "on-nvme", "in-flight" or "unknown".
func (s State) String() string {
	switch s {
	case Resident:
		return "resident"
	case OnNVMe:
		return "on-nvme"
	case InFlight:
		return "in-flight"
	}
	return "unknown"
}

// Waiter is an operation in progress; Wait blocks until it is done and
// returns its outcome. Wait may be called more than once, from any
// goroutine.
type Waiter interface{ Wait() error }

// Stats are a swapper's cumulative counters and current gauges.
type Stats struct {
	BytesRead    int64 // bytes swapped in from NVMe
	BytesWritten int64 // bytes written to NVMe (Init, staged updates)
	SwapIns      int64 // completed NVMe reads
	SwapInErrors int64 // failed NVMe reads
	CacheHits    int64 // swap-ins served by the CPU cache, without I/O
	CacheMisses  int64 // swap-ins that had to read NVMe
	DemandMisses int64 // partitions Wait had to request itself (not prefetched)
	Commits      int64 // successful CommitUpdates with at least one update
	// Published counts updates made current before their step committed
	// (PublishUpdate); Reverted the published tensors DiscardUpdates put
	// back.
	Published, Reverted int64
	Preemptions         int64 // prefetched, unclaimed partitions sent back to make room for a waited-for one
	// PreemptedBytes are the partition bytes of those Preemptions: read
	// from NVMe and given back before use, so read again when wanted. A
	// steadily rising figure says the pool is too tight for the prefetch
	// window.
	PreemptedBytes int64
	IOWait         time.Duration // time Wait spent blocked on swap-ins
	// Gauges.
	ResidentBytes int64 // pinned bytes of resident NVMe partitions and CPU-tier partitions
	DeviceBytes   int64 // device bytes of GPU-tier partitions and of NVMe partitions resident on the device (Options.DeviceIO)
	CachedBytes   int64 // pinned bytes held by the CPU cache
	InFlight      int   // NVMe swap-ins requested and not finished
	SlotsInUse    int   // BufferCount slots held (resident or in flight)
	Staged        int   // staged updates not yet committed or discarded
}

// tensor is one registered parameter; its mutable fields are guarded by
// Swapper.mu.
type tensor struct {
	name   string
	key    string // store key
	numel  int    // full tensor elements
	lo, hi int    // this rank's range
	n      int    // partition elements
	bytes  int    // partition bytes
	tier   swapper.Tier
	gen    uint64 // generation of the current values (Init, CommitUpdates)
	inited bool

	// TierNVMe.
	state  State
	res    *block // resident copy (holds a gate slot)
	flight *flight
	failed error // the last swap-in's error, until a Wait or read reports it
	// TierCPU, TierGPU: the current copy.
	cur *block

	staged *staged
	// prev is the version PublishUpdate replaced, kept until CommitUpdates
	// drops it or DiscardUpdates puts it back.
	prev *published
	// held: an update is coming (HoldPrefetch), so a prefetch waits for
	// it (wanted) instead of reading the version it replaces.
	held, wanted bool
	// streamed: an NVMe partition larger than Options.PieceBytes, moved
	// in pieces and never resident. building: a StageRange in progress.
	streamed bool
	building *builder
}

// Swapper holds this rank's partitions of the registered parameters. Its
// methods are safe for concurrent use; operations on the same tensor are
// ordered by the caller as a training loop orders them (prefetch, wait,
// read, release; updates only between steps).
type Swapper struct {
	opts  Options
	store *swapper.Store
	pool  *buffers.Pool
	dev   accel.Device
	log   *slog.Logger
	elem  int

	gate   gate
	ctx    context.Context // cancelled by Close: stops queued swap-ins
	cancel context.CancelFunc
	opctx  *swapper.OpContexts // operations' contexts (their end does not call wg.Done)
	wg     sync.WaitGroup      // swap-ins, staged writes and operations in progress

	commitMu sync.Mutex // orders CommitUpdates and DiscardUpdates

	mu        sync.Mutex
	tensors   map[string]*tensor
	dfiles    deviceFiles          // swap files opened for Options.DeviceIO
	flights   map[*flight]*tensor  // swap-ins not yet landed
	unclaimed map[*tensor]struct{} // resident by prefetch, not yet waited for or read: preemptible
	pending   map[*tensor]struct{} // resident for a Wait in progress, not yet claimed: preemptible by larger
	// stageWaiters counts acquireBuffer calls waiting for pool memory;
	// stageSizes counts those of params buffers by size.
	stageWaiters int
	stageSizes   map[int]int
	closed       bool
	cache        *ristretto.Cache[string, *cacheEntry]
	stageSeq     uint64
	lastFlight   *flight // the last swap-in requested, until it asks the pool or lands (awaitTurn)
	stats        Stats   // counters; gauges filled in by Stats()

	cachedBytes atomic.Int64
	ioWait      atomic.Int64
}

// New validates opts and returns a Swapper.
func New(opts Options) (*Swapper, error) {
	opts.EnsureDefaults()
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	s := &Swapper{
		opts:       opts,
		store:      opts.Store,
		pool:       opts.Pool,
		dev:        opts.Device,
		log:        opts.Logger,
		elem:       opts.DType.Size(),
		ctx:        ctx,
		cancel:     cancel,
		tensors:    make(map[string]*tensor),
		flights:    make(map[*flight]*tensor),
		unclaimed:  make(map[*tensor]struct{}),
		pending:    make(map[*tensor]struct{}),
		stageSizes: make(map[int]int),
	}
	s.opctx = swapper.NewOpContexts(ctx, nil)
	s.gate.limit = opts.BufferCount
	return s, nil
}

// stagingMark separates a tensor's key from a staged version's sequence.
const stagingMark = "@next."

// Register declares a parameter of numel elements (the FULL tensor) on a
// tier; this rank holds Partition(numel, Rank, WorldSize) of it. A
// partition may be empty (more ranks than elements); it then costs nothing.
func (s *Swapper) Register(name string, numel int, tier swapper.Tier) error {
	if name == "" || strings.Contains(name, stagingMark) {
		return fmt.Errorf("param: register %q: the name must be non-empty and not contain %q", name, stagingMark)
	}
	if numel <= 0 {
		return fmt.Errorf("param: register %q: numel %d must be > 0", name, numel)
	}
	lo, hi := Partition(numel, s.opts.Rank, s.opts.WorldSize)
	t := &tensor{name: name, key: s.opts.KeyPrefix + name, numel: numel, lo: lo, hi: hi, n: hi - lo, tier: tier, state: Resident}
	t.bytes = t.n * s.elem
	need := int64(t.bytes)
	switch tier {
	case swapper.TierNVMe:
		if s.store == nil {
			return fmt.Errorf("param: register %q on nvme: Options.Store is nil", name)
		}
		t.state = OnNVMe
		need = s.store.PaddedLen(need)
	case swapper.TierCPU:
	case swapper.TierGPU:
		if s.dev == nil {
			return fmt.Errorf("param: register %q on gpu: Options.Device is nil", name)
		}
	default:
		return fmt.Errorf("param: register %q: unknown tier %d", name, tier)
	}
	t.streamed = s.streams(tier, t.bytes)
	if t.streamed {
		need = s.opts.PieceBytes
	}
	if t.n == 0 {
		t.state = Resident // nothing to move
	} else if maxBuf := int64(s.pool.MaxBufferBytesFor(buffers.PurposeParams)); need > maxBuf {
		return fmt.Errorf("param: register %q: a %d-byte partition needs a buffer larger than the pool's largest for parameters (%d bytes)", name, need, maxBuf)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return ErrClosed
	}
	if _, dup := s.tensors[name]; dup {
		return fmt.Errorf("param: register %q: already registered", name)
	}
	s.tensors[name] = t
	return nil
}

// lookupLocked returns the named tensor or an error naming it.
func (s *Swapper) lookupLocked(op, name string) (*tensor, error) {
	if s.closed {
		return nil, &swapper.TensorError{Op: op, Tensor: name, Err: ErrClosed}
	}
	t, ok := s.tensors[name]
	if !ok {
		return nil, &swapper.TensorError{Op: op, Tensor: name, Err: ErrUnknown}
	}
	return t, nil
}

// begin looks the tensor up and registers an operation that Close waits
// for; the caller calls s.wg.Done when it ends. The returned context is
// ctx, also cancelled by Close, so that Close never waits for a blocked
// Acquire.
func (s *Swapper) begin(ctx context.Context, op, name string) (*tensor, context.Context, func(), error) {
	s.mu.Lock()
	t, err := s.lookupLocked(op, name)
	if err != nil {
		s.mu.Unlock()
		return nil, nil, nil, err
	}
	s.wg.Add(1)
	s.mu.Unlock()
	// The operation ends with the caller's context and at Close, without
	// an allocation per operation (see swapper.OpContexts).
	ctx, done := s.opctx.Get(ctx)
	return t, ctx, done, nil
}

// PartitionLen returns the number of elements of name this rank holds.
func (s *Swapper) PartitionLen(name string) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	t, err := s.lookupLocked("partition-len", name)
	if err != nil {
		return 0, err
	}
	return t.n, nil
}

// PartitionRange returns this rank's element range [lo, hi) of name.
func (s *Swapper) PartitionRange(name string) (lo, hi int, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	t, err := s.lookupLocked("partition-range", name)
	if err != nil {
		return 0, 0, err
	}
	return t.lo, t.hi, nil
}

// StoreKey returns the store key of name's current NVMe version (for
// diagnostics and tests, e.g. Store.Locate).
func (s *Swapper) StoreKey(name string) string { return s.opts.KeyPrefix + name }

// Init sets this rank's partition of name: values (fp32, PartitionLen
// long) are converted to the dtype and stored on the tensor's tier (NVMe:
// written to the store and waited for). It replaces any earlier values at
// once, like a committed update; on error the earlier values stay.
func (s *Swapper) Init(ctx context.Context, name string, values []float32) error {
	t, ctx, done, err := s.begin(ctx, "init", name)
	if err != nil {
		return err
	}
	defer s.wg.Done()
	defer done()
	if len(values) != t.n {
		return &swapper.TensorError{Op: "init", Tensor: name, Err: fmt.Errorf("%d values for a partition of %d elements", len(values), t.n)}
	}
	if t.n == 0 {
		s.mu.Lock()
		t.inited = true
		s.mu.Unlock()
		return nil
	}
	st, err := s.prepare(ctx, t, values, t.key)
	if err != nil {
		return err
	}
	if err := st.Wait(); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		st.disposeBlock()
		return &swapper.TensorError{Op: "init", Tensor: name, Err: ErrClosed}
	}
	s.installLocked(t, st)
	return nil
}

// Unregister forgets name: its stored partition (NVMe) or copy (CPU, GPU)
// is freed and the name may be registered again. It undoes a registration
// whose later steps failed, so it refuses a partition that is resident or
// in flight (swapped in and not released) or has a staged update.
func (s *Swapper) Unregister(name string) error {
	s.mu.Lock()
	t, err := s.lookupLocked("unregister", name)
	if err != nil {
		s.mu.Unlock()
		return err
	}
	if t.tier == swapper.TierNVMe && t.n > 0 && t.state != OnNVMe {
		s.mu.Unlock()
		return &swapper.TensorError{Op: "unregister", Tensor: name, Err: fmt.Errorf("partition is %s; release it first", t.state)}
	}
	if t.staged != nil {
		s.mu.Unlock()
		return &swapper.TensorError{Op: "unregister", Tensor: name, Err: errors.New("an update is staged; commit or discard it first")}
	}
	delete(s.tensors, name)
	if s.cache != nil {
		s.cache.Del(t.name)
	}
	if t.cur != nil {
		t.cur.release()
		t.cur = nil
	}
	s.mu.Unlock()
	if t.tier == swapper.TierNVMe && s.store != nil {
		s.store.Delete(t.key)
	}
	return nil
}

// ReadBytes copies name's partition, encoded in the parameter dtype
// (Options.DType, little-endian), into dst (PartitionLen x the dtype's size
// bytes). Residency rules are ReadFloat32's.
func (s *Swapper) ReadBytes(ctx context.Context, name string, dst []byte) error {
	t, ctx, done, err := s.begin(ctx, "read", name)
	if err != nil {
		return err
	}
	defer s.wg.Done()
	defer done()
	if len(dst) != t.bytes {
		return &swapper.TensorError{Op: "read", Tensor: name, Err: fmt.Errorf("destination has %d bytes, the partition %d", len(dst), t.bytes)}
	}
	if t.n == 0 {
		return nil
	}
	if t.streamed {
		es := s.elem
		return s.readStreamed(ctx, t, []Span{{0, t.n}}, func(out int, src []byte) error { copy(dst[out*es:], src); return nil })
	}
	blk, err := s.acquireCurrent(ctx, t)
	if err != nil {
		return err
	}
	defer blk.release()
	if blk.buf != nil {
		yield.Copy(dst, blk.buf.Bytes()[:t.bytes])
		return nil
	}
	if err := s.deviceCopy(func(st accel.Stream) error {
		return s.dev.CopyFromDevice(st, dst, blk.mem, 0)
	}); err != nil {
		return &swapper.TensorError{Op: "read", Tensor: t.name, Err: err}
	}
	return nil
}

// ReadAs copies name's partition into dst encoded in dtype (little-endian,
// PartitionLen x dtype's size bytes), converting from the parameter dtype
// element by element (buffers.Transcode) when they differ: no buffer of
// the partition's size is allocated on the Go heap, so a swap-in straight
// into a framework's tensor of another dtype costs none. Residency rules
// are ReadFloat32's; a GPU-tier partition is staged through pinned memory.
func (s *Swapper) ReadAs(ctx context.Context, name string, dtype swapper.DType, dst []byte) error {
	if dtype == s.opts.DType {
		return s.ReadBytes(ctx, name, dst)
	}
	if !dtype.Valid() {
		return &swapper.TensorError{Op: "read", Tensor: name, Err: fmt.Errorf("unknown dtype %d", dtype)}
	}
	t, ctx, done, err := s.begin(ctx, "read", name)
	if err != nil {
		return err
	}
	defer s.wg.Done()
	defer done()
	if len(dst) != t.n*dtype.Size() {
		return &swapper.TensorError{Op: "read", Tensor: name, Err: fmt.Errorf("destination has %d bytes, the partition %d elements of %s", len(dst), t.n, dtype)}
	}
	if t.n == 0 {
		return nil
	}
	if t.streamed {
		es, ds := s.elem, dtype.Size()
		return s.readStreamed(ctx, t, []Span{{0, t.n}}, func(out int, src []byte) error {
			buffers.Transcode(s.opts.DType, src, dtype, dst[out*ds:out*ds+len(src)/es*ds])
			return nil
		})
	}
	blk, err := s.acquireCurrent(ctx, t)
	if err != nil {
		return err
	}
	defer blk.release()
	if blk.buf != nil {
		buffers.Transcode(s.opts.DType, blk.buf.Bytes()[:t.bytes], dtype, dst)
		return nil
	}
	stage, err := s.pool.Acquire(ctx, t.bytes, buffers.PurposeStaging)
	if err != nil {
		return &swapper.TensorError{Op: "read", Tensor: t.name, Err: err}
	}
	defer stage.Release()
	if err := s.deviceCopy(func(st accel.Stream) error {
		return s.dev.CopyFromDevice(st, stage.Bytes()[:t.bytes], blk.mem, 0)
	}); err != nil {
		return &swapper.TensorError{Op: "read", Tensor: t.name, Err: err}
	}
	buffers.Transcode(s.opts.DType, stage.Bytes()[:t.bytes], dtype, dst)
	return nil
}

// State reports where name's partition is (Unknown for an unregistered
// name).
func (s *Swapper) State(name string) State {
	s.mu.Lock()
	defer s.mu.Unlock()
	t, ok := s.tensors[name]
	if !ok {
		return Unknown
	}
	return t.state
}

// Prefetch starts swapping in the named NVMe partitions in the background;
// it does not wait for buffers or slots (the swap-ins queue for them). It is
// a no-op for partitions already resident or in flight and for CPU and GPU
// tiers. A partition found in the CPU cache becomes resident without I/O.
// Errors (unknown or uninitialized names) are returned for those names;
// the others are still started. Swap-in errors are reported by Wait.
func (s *Swapper) Prefetch(names ...string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	var errs []error
	for _, name := range names {
		t, err := s.lookupLocked("prefetch", name)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if t.tier != swapper.TierNVMe || t.state != OnNVMe || t.streamed {
			continue
		}
		if !t.inited {
			errs = append(errs, &swapper.TensorError{Op: "prefetch", Tensor: name, Err: ErrNotInitialized})
			continue
		}
		if t.held {
			t.wanted = true // read once the update is current (releaseHeldLocked)
			continue
		}
		s.startFlightLocked(t, false)
	}
	return errors.Join(errs...)
}

// Wait blocks until every named partition is resident, and only those: it
// is a barrier for this set, not for every swap-in in flight. A name that
// was not prefetched is fetched now, ahead of queued prefetches (a demand
// miss). The error names each tensor that failed (a read error, or
// swapper.ErrChecksum for corrupt bytes); a failed partition goes back to
// OnNVMe, and a later Wait retries it. ctx bounds the wait; swap-ins it
// started continue.
//
// The set is claimed (kept resident, never preempted) all at once, when
// every partition of it is resident, and waited for largest first: until
// then a larger partition of the set that the pool cannot place may send
// a smaller one back, and Wait fetches it again (see preemptForLocked).
// Claiming them one by one let a layer's small partitions hold the pool's
// region fragmented while its largest waited for a block forever.
func (s *Swapper) Wait(ctx context.Context, names ...string) error {
	ts := make([]*tensor, 0, len(names))
	var errs []error
	s.mu.Lock()
	for _, name := range names {
		t, err := s.lookupLocked("swap-in", name)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if t.tier != swapper.TierNVMe {
			continue
		}
		if t.streamed {
			if !t.inited {
				errs = append(errs, &swapper.TensorError{Op: "swap-in", Tensor: name, Err: ErrNotInitialized})
			}
			continue // read in pieces, never resident
		}
		switch t.state {
		case OnNVMe:
			if !t.inited {
				errs = append(errs, &swapper.TensorError{Op: "swap-in", Tensor: name, Err: ErrNotInitialized})
				continue
			}
			if t.failed != nil {
				break // a prefetch failed: waitResident reports it
			}
			s.stats.DemandMisses++
			s.startFlightLocked(t, true)
		case InFlight:
			s.promoteLocked(t.flight)
		case Resident:
			s.pendLocked(t)
		}
		ts = append(ts, t)
	}
	s.mu.Unlock()
	slices.SortStableFunc(ts, func(a, b *tensor) int { return cmp.Compare(b.bytes, a.bytes) })
	for {
		failed := false
		for _, t := range ts {
			if err := s.waitResident(ctx, t); err != nil {
				errs = append(errs, err)
				failed = true
			}
		}
		s.mu.Lock()
		all := true
		for _, t := range ts {
			if t.state != Resident && !t.streamed {
				all = false
			}
		}
		if all || failed {
			for _, t := range ts {
				if t.state == Resident {
					s.claimLocked(t)
				}
			}
		}
		s.mu.Unlock()
		if all || failed {
			return errors.Join(errs...)
		}
		// A larger partition of the set sent one back: fetch it again.
	}
}

// waitResident blocks until t is resident (pending: the Wait claims it).
// It re-requests t when a swap-in it waited for was dropped (Release, a
// preemption, or an update made it stale).
func (s *Swapper) waitResident(ctx context.Context, t *tensor) error {
	var blockedSince time.Time
	defer func() {
		if !blockedSince.IsZero() {
			s.ioWait.Add(int64(time.Since(blockedSince)))
		}
	}()
	for {
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			return &swapper.TensorError{Op: "swap-in", Tensor: t.name, Err: ErrClosed}
		}
		switch t.state {
		case Resident:
			s.pendLocked(t)
			s.mu.Unlock()
			return nil
		case OnNVMe:
			if err := t.failed; err != nil {
				t.failed = nil // reported; the next Wait retries
				s.mu.Unlock()
				return err
			}
			s.stats.DemandMisses++
			s.startFlightLocked(t, true)
		}
		f := t.flight
		s.promoteLocked(f)
		s.mu.Unlock()
		if blockedSince.IsZero() {
			blockedSince = time.Now()
		}
		select {
		case <-f.done:
		case <-ctx.Done():
			return &swapper.TensorError{Op: "swap-in", Tensor: t.name, Err: ctx.Err()}
		}
		if f.err != nil {
			s.mu.Lock()
			if t.failed == f.err {
				t.failed = nil
			}
			s.mu.Unlock()
			return f.err
		}
	}
}

// SwapIn is Prefetch followed by Wait.
func (s *Swapper) SwapIn(ctx context.Context, names ...string) error {
	if err := s.Prefetch(names...); err != nil {
		return err
	}
	return s.Wait(ctx, names...)
}

// ReadFloat32 converts name's partition to fp32 into dst (PartitionLen
// long). An NVMe partition must be resident or in flight (ReadFloat32
// waits for it) or in the CPU cache; otherwise the error wraps
// ErrNotResident. A GPU partition is copied to the host through a staging
// buffer from the pool.
func (s *Swapper) ReadFloat32(ctx context.Context, name string, dst []float32) error {
	t, ctx, done, err := s.begin(ctx, "read", name)
	if err != nil {
		return err
	}
	defer s.wg.Done()
	defer done()
	if len(dst) != t.n {
		return &swapper.TensorError{Op: "read", Tensor: name, Err: fmt.Errorf("destination has %d elements, the partition %d", len(dst), t.n)}
	}
	if t.n == 0 {
		return nil
	}
	if t.streamed {
		es := s.elem
		return s.readStreamed(ctx, t, []Span{{0, t.n}}, func(out int, src []byte) error {
			buffers.Decode(s.opts.DType, dst[out:out+len(src)/es], src)
			return nil
		})
	}
	blk, err := s.acquireCurrent(ctx, t)
	if err != nil {
		return err
	}
	defer blk.release()
	if blk.buf != nil {
		buffers.Decode(s.opts.DType, dst, blk.buf.Bytes()[:t.bytes])
		return nil
	}
	return s.readDevice(ctx, t, blk, dst)
}

// acquireCurrent returns a reference to t's current copy.
func (s *Swapper) acquireCurrent(ctx context.Context, t *tensor) (*block, error) {
	for {
		s.mu.Lock()
		if t.tier != swapper.TierNVMe {
			blk := t.cur
			s.mu.Unlock()
			if blk == nil {
				return nil, &swapper.TensorError{Op: "read", Tensor: t.name, Err: ErrNotInitialized}
			}
			blk.retain() // t.cur is only released under s.mu, after swapping it out
			return blk, nil
		}
		switch t.state {
		case Resident:
			blk := t.res
			blk.retain()
			s.claimLocked(t)
			s.mu.Unlock()
			return blk, nil
		case InFlight:
			f := t.flight
			s.promoteLocked(f)
			f.keep = true // this read claims it when it lands
			s.mu.Unlock()
			select {
			case <-f.done:
			case <-ctx.Done():
				return nil, &swapper.TensorError{Op: "read", Tensor: t.name, Err: ctx.Err()}
			}
			if f.err != nil {
				return nil, f.err
			}
			continue
		}
		failed := t.failed
		t.failed = nil
		s.mu.Unlock()
		if blk, _, ok := s.cacheLookup(t); ok {
			return blk, nil
		}
		if failed != nil {
			return nil, failed
		}
		return nil, &swapper.TensorError{Op: "read", Tensor: t.name, Err: ErrNotResident}
	}
}

// readDevice copies a GPU partition to the host and converts it.
func (s *Swapper) readDevice(ctx context.Context, t *tensor, blk *block, dst []float32) error {
	stage, err := s.pool.Acquire(ctx, t.bytes, buffers.PurposeStaging)
	if err != nil {
		return &swapper.TensorError{Op: "read", Tensor: t.name, Err: err}
	}
	defer stage.Release()
	if err := s.deviceCopy(func(st accel.Stream) error {
		return s.dev.CopyFromDevice(st, stage.Bytes(), blk.mem, 0)
	}); err != nil {
		return &swapper.TensorError{Op: "read", Tensor: t.name, Err: err}
	}
	buffers.Decode(s.opts.DType, dst, stage.Bytes())
	return nil
}

// deviceCopy runs one copy on a fresh stream and synchronizes it.
func (s *Swapper) deviceCopy(issue func(accel.Stream) error) error {
	st, err := s.dev.NewStream()
	if err != nil {
		return err
	}
	err = issue(st)
	if serr := st.Synchronize(); err == nil {
		err = serr
	}
	if cerr := st.Close(); err == nil {
		err = cerr
	}
	return err
}

// Release drops the resident copies of the named NVMe partitions without
// writing them back (parameters are read-only between optimizer steps).
// With a CPU cache the buffers stay there while its budget allows. A swap-in
// still in flight is abandoned (its bytes go to the cache). Unknown names,
// CPU and GPU tiers are ignored.
func (s *Swapper) Release(names ...string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return
	}
	for _, name := range names {
		t, ok := s.tensors[name]
		if !ok || t.tier != swapper.TierNVMe || t.n == 0 || t.streamed {
			continue
		}
		t.wanted = false
		switch t.state {
		case Resident:
			s.claimLocked(t)
			blk := t.res
			t.res, t.state = nil, OnNVMe
			s.gate.release()
			s.cachePutLocked(t, blk, t.gen)
		case InFlight:
			s.dropFlightLocked(t)
		}
	}
}

// Stats returns the counters and gauges.
func (s *Swapper) Stats() Stats {
	s.mu.Lock()
	st := s.stats
	for _, t := range s.tensors {
		if t.res != nil {
			if t.res.mem != nil {
				st.DeviceBytes += t.res.bytes
			} else {
				st.ResidentBytes += t.res.bytes
			}
		}
		if t.cur != nil {
			if t.cur.mem != nil {
				st.DeviceBytes += t.cur.bytes
			} else {
				st.ResidentBytes += t.cur.bytes
			}
		}
		if t.state == InFlight {
			st.InFlight++
		}
		if t.staged != nil {
			st.Staged++
		}
	}
	s.mu.Unlock()
	st.IOWait = time.Duration(s.ioWait.Load())
	st.CachedBytes = s.cachedBytes.Load()
	st.SlotsInUse = s.gate.inUse()
	return st
}

// Close waits for swap-ins and staged writes in flight (queued ones are
// abandoned), discards staged updates, releases every buffer and device
// allocation and purges the CPU cache. The store's current versions stay.
// Later calls fail with ErrClosed; Close itself is idempotent.
func (s *Swapper) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	s.cancel()
	s.opctx.Close()
	s.mu.Unlock()
	s.dropBuilds()
	s.wg.Wait()

	s.mu.Lock()
	var staged []*staged
	for _, t := range s.tensors {
		if t.res != nil {
			t.res.release()
			t.res = nil
			s.gate.release()
		}
		if t.cur != nil {
			t.cur.release()
			t.cur = nil
		}
		if t.staged != nil {
			staged = append(staged, t.staged)
			t.staged = nil
		}
		if t.prev != nil {
			// The step never committed: its last published version stays
			// in the store (Close ends a runtime whose step was left
			// undecided), the older one goes.
			t.prev.drop(s)
			t.prev = nil
		}
		t.flight = nil
		if t.tier == swapper.TierNVMe && t.n > 0 {
			t.state = OnNVMe
		}
	}
	clear(s.unclaimed)
	clear(s.pending)
	c := s.cache
	s.cache = nil
	s.mu.Unlock()
	for _, st := range staged {
		s.dispose(st)
	}
	if c != nil {
		c.Close() // evicts every entry: OnExit drops the cache's references
	}
	return s.dfiles.close()
}

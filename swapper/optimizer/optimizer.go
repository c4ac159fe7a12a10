package optimizer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/zinfio/zinf/buffers"
	"github.com/zinfio/zinf/swapper"
)

// Optimizer holds, per registered tensor, this rank's fp32 master partition
// and Adam's exp_avg and exp_avg_sq, split into sub-groups, on NVMe (or in
// pinned memory), and steps them with a read-ahead / update / write-behind
// pipeline. Register, LoadState, ReadState, Step, BeginStep and Close are
// serialised (one runs at a time); while a transaction from BeginStep is
// open, ReadState still works, Close aborts the transaction, and the others
// fail with ErrStepOpen. Names, StepCount and Stats may be called at any
// time from any goroutine. Close is called once.
type Optimizer struct {
	opts  Options
	sz    sizer   // sizes the pinned buffers of sub-groups
	kern  *kernel // runs the update rule
	width int     // arrays of a record: the master and the rule's states
	// format is how the rule's states are stored (Options.StateFormat).
	format StateFormat

	// opMu serialises the operations that touch states.
	opMu   sync.Mutex
	closed bool
	txn    *StepTxn // the open step transaction, nil when none

	// memMu guards the sub-groups' mem and held (states in pinned memory)
	// against StateSnapshot.Release, which may run on any goroutine at any
	// time.
	memMu sync.Mutex

	// mu guards the fields below, which readers see between operations.
	mu      sync.Mutex
	tensors []*tensor
	byName  map[string]*tensor
	sgs     []*subGroup // every sub-group, in registration order
	step    int
	stats   Stats
}

// tensor is one registered parameter partition.
type tensor struct {
	name   string
	n      int         // elements in the partition
	sgs    []*subGroup // its sub-groups, in order
	format StateFormat // how its states are stored (Options.StateFormat, StateFormatFor)
}

// subGroup is a chunk [off, off+n) of a tensor's partition. Its states are
// one record, the master and the rule's states (Adam: master | exp_avg |
// exp_avg_sq) laid out as LayoutForArrays(n, arrays) says, stored under key
// (NVMe) or held in mem[cur] (pinned memory).
type subGroup struct {
	t      *tensor
	j      int // index within the tensor
	off, n int
	lay    RecordLayout
	key    string
	mem    [2]*buffers.Buffer // Store == nil: the current record and the one a step builds
	cur    int
	// held[k] counts the StateSnapshots holding mem[k] (guarded by
	// Optimizer.memMu): a held record is never written again; a step or
	// LoadState that would write it puts a fresh buffer in its place.
	held [2]int
}

// recordBytes is the byte length of a sub-group's state record.
func (sg *subGroup) recordBytes() int { return int(sg.lay.Bytes) }

// states returns the master, exp_avg and exp_avg_sq inside rec, a record
// of sg's layout (the first two states of another rule; nil where it has
// fewer).
func (sg *subGroup) states(rec []float32) (master, expAvg, expAvgSq []float32) {
	return sg.lay.states(rec)
}

// arrays returns every array of rec, a record of sg's layout: the master,
// then the rule's states.
func (sg *subGroup) arrays(rec []float32) [][]float32 {
	out := make([][]float32, sg.lay.Arrays)
	for k := range out {
		out[k] = sg.lay.array(rec, k)
	}
	return out
}

// Layout of the state records.
const (
	// StaggerMinElems is the smallest sub-group whose record is staggered
	// (see RecordLayout). Below it a record is 12 bytes per element, the
	// three states back to back: its operands are at most 256 KiB each,
	// and the stagger would cost more than 2.1% of the record.
	StaggerMinElems = 1 << 16
	// staggerLine is the stagger unit: a cache line.
	staggerLine = 64
	// staggerPage is the alignment of a staggered state before its
	// stagger: pages (and the pool's buffers) start at multiples of it.
	staggerPage = 4096
)

// RecordLayout says where a sub-group's states lie in its record (on NVMe
// and in pinned memory): Elems values of each of its Arrays arrays — the
// fp32 master, then the update rule's states (Adam: exp_avg, exp_avg_sq),
// in StateKind order, stored in Format (fp32 unless Options.StateFormat
// says otherwise) — at byte offsets Offsets, Lens bytes each, in a record
// of Bytes bytes.
//
// A state in FormatBlockwise8 is its absmax (one float32 per block of
// Blockwise8BlockSize elements) followed by its codes (one byte per
// element), padded to a multiple of 4 bytes; in FormatBF16 it is Elems
// bfloat16s, padded likewise.
//
// A sub-group of fewer than StaggerMinElems elements has them back to
// back (fp32: 0, 4n, 8n; 12n bytes). A larger one staggers them: master
// starts one cache line (64 bytes) into the record and each state a page
// plus a cache line after the page-aligned end of the previous one, so
// master, exp_avg and exp_avg_sq start 64, 128 and 192 bytes past a page
// boundary while the gradient slice (read into page-aligned memory)
// starts on one. Back to back, the four operands of an update of 64 Mi
// elements would lie exactly 2^28 bytes apart and map to the same cache
// sets (on huge pages, in every level); staggered, they start on four
// different cache lines of a page, so no two are congruent modulo any
// power of two from 256 bytes up. The padding (8 to 16.5 KiB of zero
// bytes per record) costs at most 2.1% of an fp32 record, at the
// threshold, and less than 0.01% from 16 Mi elements up.
type RecordLayout struct {
	Elems   int
	Arrays  int
	Format  StateFormat
	Offsets [MaxArrays]int64
	Lens    [MaxArrays]int64
	Bytes   int64
}

// MaxArrays is the most arrays a record holds (Adam's three).
const MaxArrays = 3

// LayoutFor returns the layout of Adam's record of a sub-group of n
// elements: LayoutForArrays(n, 3).
func LayoutFor(n int) RecordLayout { return LayoutForArrays(n, 3) }

// LayoutForArrays returns the layout of a record of arrays arrays (1 to
// MaxArrays: the master and the rule's states) of n fp32 elements each.
func LayoutForArrays(n, arrays int) RecordLayout {
	return LayoutForFormat(n, arrays, FormatFP32)
}

// LayoutForFormat returns the layout of a record of arrays arrays (1 to
// MaxArrays) of n elements each: the fp32 master, then arrays-1 states in
// format f (which must be valid).
func LayoutForFormat(n, arrays int, f StateFormat) RecordLayout {
	l := RecordLayout{Elems: n, Arrays: arrays, Format: f}
	if f.Encoding == EncodingBlockwise8 && f.BlockSize == 0 {
		l.Format.BlockSize = Blockwise8BlockSize
	}
	for k := range arrays {
		l.Lens[k] = 4 * int64(n)
		if k > 0 {
			l.Lens[k] = roundUp(f.StateBytes(int64(n)), 4)
		}
	}
	if n < StaggerMinElems {
		at := int64(0)
		for k := range arrays {
			l.Offsets[k] = at
			at += l.Lens[k]
		}
		l.Bytes = at
		return l
	}
	at := int64(staggerLine)
	for k := range arrays {
		l.Offsets[k] = at
		at += roundUp(l.Lens[k], staggerPage) + staggerPage + staggerLine
	}
	l.Bytes = l.Offsets[arrays-1] + l.Lens[arrays-1]
	return l
}

// array returns array k of rec, a record of this layout, as fp32: the
// master, or a state of an fp32 record.
func (l RecordLayout) array(rec []float32, k int) []float32 {
	lo := int(l.Offsets[k] / 4)
	return rec[lo : lo+l.Elems : lo+l.Elems]
}

// compressed reports whether the states are stored narrower than fp32.
func (l RecordLayout) compressed() bool { return l.Format.Encoding != EncodingFP32 }

// state8 returns state k (k >= 1) of rec, a record of an 8-bit blockwise
// layout: its codes and its absmax.
func (l RecordLayout) state8(rec []float32, k int) (codes []uint8, absmax []float32) {
	blocks := int(l.Format.Blocks(int64(l.Elems)))
	lo := int(l.Offsets[k] / 4)
	absmax = rec[lo : lo+blocks : lo+blocks]
	b := buffers.AsBytes(rec[lo+blocks : lo+int(l.Lens[k]/4)])
	return b[:l.Elems:l.Elems], absmax
}

// stateBF16 returns state k (k >= 1) of rec, a record of a bf16 layout.
func (l RecordLayout) stateBF16(rec []float32, k int) []buffers.BFloat16 {
	lo := int(l.Offsets[k] / 4)
	return buffers.View[buffers.BFloat16](buffers.AsBytes(rec[lo : lo+int(l.Lens[k]/4)]))[:l.Elems:l.Elems]
}

// states returns the master and the first two states inside rec, a record
// of this fp32 layout (nil for arrays it does not have).
func (l RecordLayout) states(rec []float32) (master, expAvg, expAvgSq []float32) {
	var out [3][]float32
	for k := range min(l.Arrays, 3) {
		out[k] = l.array(rec, k)
	}
	return out[0], out[1], out[2]
}

// pads returns the parts of rec outside the arrays, to be zeroed when a
// record is built.
func (l RecordLayout) pads(rec []float32) [][]float32 {
	var out [][]float32
	at := 0
	for k, off := range l.Offsets[:l.Arrays] {
		lo := int(off / 4)
		if lo > at {
			out = append(out, rec[at:lo])
		}
		at = lo + int(l.Lens[k]/4)
	}
	return out
}

// encode stores state k (k >= 1) of rec, a record of this layout, from
// the fp32 values src: a copy, rounded to bf16, or quantized blockwise
// (exp_avg, the first state, with SignedDynamicMap; the second with
// UnsignedDynamicMap). It zeroes the padding of a narrow state.
func (l RecordLayout) encode(rec []float32, k int, src []float32) {
	switch l.Format.Encoding {
	case EncodingBF16:
		dst := l.stateBF16(rec, k)
		buffers.Float32ToBFloat16(dst, src[:l.Elems])
		lo := int(l.Offsets[k] / 4)
		b := buffers.AsBytes(rec[lo : lo+int(l.Lens[k]/4)])
		clear(b[2*l.Elems:])
	case EncodingBlockwise8:
		codes, absmax := l.state8(rec, k)
		stateMap(k).Quantize(codes, absmax, src[:l.Elems])
		lo := int(l.Offsets[k] / 4)
		b := buffers.AsBytes(rec[lo+len(absmax) : lo+int(l.Lens[k]/4)])
		clear(b[l.Elems:])
	default:
		copy(l.array(rec, k), src[:l.Elems])
	}
}

// decode writes state k (k >= 1) of rec, a record of this layout, to dst
// as fp32: a copy, widened from bf16 or dequantized.
func (l RecordLayout) decode(dst, rec []float32, k int) {
	switch l.Format.Encoding {
	case EncodingBF16:
		buffers.BFloat16ToFloat32(dst[:l.Elems], l.stateBF16(rec, k))
	case EncodingBlockwise8:
		codes, absmax := l.state8(rec, k)
		stateMap(k).Dequantize(dst[:l.Elems], codes, absmax)
	default:
		copy(dst[:l.Elems], l.array(rec, k))
	}
}

// stateMap is the map of state k (k >= 1) of an 8-bit record: signed for
// Adam's exp_avg (k = 1), unsigned for exp_avg_sq (k = 2).
func stateMap(k int) QuantMap {
	if k == 1 {
		return SignedDynamicMap()
	}
	return UnsignedDynamicMap()
}

// staged and prev name a sub-group's record while a step is being committed.
func (sg *subGroup) staged() string { return sg.key + "~staged" }
func (sg *subGroup) prev() string   { return sg.key + "~prev" }

// Stats are an optimizer's counters.
type Stats struct {
	Tensors    int   // registered tensors
	SubGroups  int   // sub-groups over all tensors
	Elements   int64 // parameter elements over all tensors
	StateBytes int64 // bytes of the master and the rule's states (Adam: 12 per element in fp32; see StateFormat.RecordBytes)
	// RecordBytes is the bytes of the sub-groups' records: StateBytes plus
	// the stagger of large sub-groups (see RecordLayout). A step reads and
	// writes each record once.
	RecordBytes int64

	Steps        int64     // committed steps
	FailedSteps  int64     // Step and StepTxn.Commit calls that returned an error
	AbortedSteps int64     // transactions ended by StepTxn.Abort or Close
	Last         StepStats // the last step, committed, failed or aborted
	Total        StepStats // sums over every step
}

// StepStats describe one step, taken by Step or a transaction (or, summed,
// many).
type StepStats struct {
	Step      int  // the step number attempted (in Total: the last one)
	Committed bool // whether it was committed (in Total: the last one)
	SubGroups int  // sub-groups updated
	// BytesRead and BytesWritten count optimizer-state bytes moved from and
	// to the store (0 with states in pinned memory); GradBytes the gradient
	// bytes read from Grads.
	BytesRead, BytesWritten, GradBytes int64
	// HandedOver counts the tensors handed over with StepTxn.Tensor
	// before Commit (0 for Step).
	HandedOver int
	// Prefetched counts the sub-groups whose record StepTxn.Prefetch
	// started reading before their tensor was handed over and whose update
	// used it.
	Prefetched int
	// Elapsed is the wall time of Step, or of a transaction from BeginStep
	// to the end of Commit or Abort. Compute is the time spent in Adam and
	// copies on the update goroutine; ReadWait the time it waited for
	// read-ahead (buffers, state reads, gradients); WriteWait the time it
	// waited to start a write-behind (or, at depth 0, for the write and the
	// staged parameter write to finish); Idle the time it waited for the
	// next tensor to be handed over (a transaction's pipeline waiting for
	// the backward pass); Commit the time of the final rename and
	// Params.CommitUpdates. Compute/(Elapsed-Idle) near 1 means the I/O
	// was hidden.
	//
	// Drain is the time Commit waited for the pipeline to finish: with
	// Step nearly all of Elapsed, with a transaction overlapping the
	// backward pass the part of the step that the backward pass did not
	// hide.
	Elapsed, Compute, ReadWait, WriteWait, Idle, Commit, Drain time.Duration
	// IOGaps is the time, between the start of the step's first read and
	// the end of its last write-behind, during which none of its record
	// reads, gradient reads or write-behinds was in flight: the pipeline's
	// bubbles, when the disk had nothing of the step's to do. Summed in
	// Total.
	IOGaps time.Duration
	// Timeline is every sub-group's way through the pipeline (see
	// SubGroupTiming), ordered by when its read-ahead began. Only Last has
	// one; Total's is nil.
	Timeline []SubGroupTiming
	// Start is when the step began (BeginStep, or Step's start): the
	// instant Timeline's offsets count from. Only Last has one.
	Start time.Time
}

func (s *StepStats) add(o StepStats) {
	s.Step, s.Committed = o.Step, o.Committed
	s.SubGroups += o.SubGroups
	s.BytesRead += o.BytesRead
	s.BytesWritten += o.BytesWritten
	s.GradBytes += o.GradBytes
	s.Elapsed += o.Elapsed
	s.Compute += o.Compute
	s.ReadWait += o.ReadWait
	s.WriteWait += o.WriteWait
	s.Idle += o.Idle
	s.IOGaps += o.IOGaps
	s.Commit += o.Commit
	s.Drain += o.Drain
	s.HandedOver += o.HandedOver
	s.Prefetched += o.Prefetched
}

// New returns an Optimizer with no tensors. opts is copied, defaulted
// (EnsureDefaults) and validated.
func New(opts Options) (*Optimizer, error) {
	opts.EnsureDefaults()
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	k, err := resolveKernel(opts.Kernel)
	if err != nil {
		return nil, err // Validate reported it
	}
	return &Optimizer{opts: opts, sz: newSizer(opts, nil), kern: k.impl(), width: 1 + opts.Hyper.StateCount(), format: opts.StateFormat, byName: make(map[string]*tensor)}, nil
}

// Kernel returns the kernel the optimizer's steps run the update rule on.
func (o *Optimizer) Kernel() Kernel { return Kernel{o.kern} }

// Options returns the optimizer's effective options (defaults filled).
func (o *Optimizer) Options() Options { return o.opts }

// Register adds this rank's fp32 partition of a parameter: master is copied
// as the master weights, exp_avg and exp_avg_sq start at zero, and the
// states are written to the store (or to pinned memory) before Register
// returns. Step steps tensors in registration order (a transaction in the
// order they are handed over). It blocks while the pool is exhausted (with
// a Store), and fails with ErrPoolTooSmall when the pool could never let a
// step through: it must hold, beside the records kept in pinned memory
// (without a Store), one sub-group's buffer (its record and gradient
// slice; see PinnedNeedBytes). An empty partition (a rank that holds no
// element of a small tensor) is legal and costs nothing: no record, no
// buffer, no call to Grads or Params. Register is all or nothing: when it
// fails (a pool too small, a store write failing), nothing of name is
// left, in the store or in the pool, and name may be registered again. A
// tensor registered after steps were taken starts with the shared step
// counter's bias correction.
func (o *Optimizer) Register(name string, master []float32) error {
	o.opMu.Lock()
	defer o.opMu.Unlock()
	fail := func(err error) error { return &Error{Op: "register", Tensor: name, SubGroup: -1, Err: err} }
	if o.closed {
		return fail(ErrClosed)
	}
	if o.txn != nil {
		return fail(ErrStepOpen)
	}
	if name == "" {
		return fail(errors.New("empty tensor name"))
	}
	o.mu.Lock()
	_, dup := o.byName[name]
	o.mu.Unlock()
	if dup {
		return fail(ErrRegistered)
	}
	t := &tensor{name: name, n: len(master), format: o.format}
	if f := o.opts.StateFormatFor; f != nil {
		t.format = f(name, len(master))
		if err := t.format.Validate(); err != nil {
			return fail(err)
		}
		if t.format.Encoding != EncodingFP32 && o.opts.Hyper.Rule != RuleAdam {
			return fail(fmt.Errorf("StateFormatFor gives %s states; %s keeps fp32 states", t.format, o.opts.Hyper.Rule))
		}
		if t.format.Encoding == EncodingBlockwise8 && o.opts.SubGroupSize%Blockwise8BlockSize != 0 {
			return fail(fmt.Errorf("StateFormatFor gives 8-bit states, which need a SubGroupSize that is a multiple of %d (it is %d)", Blockwise8BlockSize, o.opts.SubGroupSize))
		}
	}
	for j, off := 0, 0; off < t.n; j, off = j+1, off+o.opts.SubGroupSize {
		n := min(o.opts.SubGroupSize, t.n-off)
		t.sgs = append(t.sgs, &subGroup{t: t, j: j, off: off, n: n, lay: LayoutForFormat(n, o.width, t.format),
			key: fmt.Sprintf("%s/%s#%d", o.opts.Prefix, name, j)})
	}
	if err := o.checkPool(t); err != nil {
		return fail(err)
	}
	if err := o.writeInitial(t, master); err != nil {
		return fail(err)
	}
	o.mu.Lock()
	o.tensors = append(o.tensors, t)
	o.byName[name] = t
	o.sgs = append(o.sgs, t.sgs...)
	o.stats.Tensors++
	o.stats.SubGroups += len(t.sgs)
	o.stats.Elements += int64(t.n)
	o.stats.StateBytes += 4*int64(t.n) + int64(o.width-1)*t.format.StateBytes(int64(t.n))
	for _, sg := range t.sgs {
		o.stats.RecordBytes += sg.lay.Bytes
	}
	o.mu.Unlock()
	return nil
}

// bufBytes is the pool request for a buffer of n bytes that the store may
// read or write: padded to the store's alignment.
func (o *Optimizer) bufBytes(n int) int {
	if o.opts.Store == nil {
		return n
	}
	return int(o.opts.Store.PaddedLen(int64(n)))
}

// checkPool refuses a tensor with which a step could never get its
// buffers, so a Step cannot wait forever on a pool that is simply too
// small: the pool must hold the records kept in pinned memory and one
// sub-group's buffer (a smaller pool than PinnedNeedBytes only makes the
// pipeline wait).
func (o *Optimizer) checkPool(t *tensor) error {
	p := o.opts.Pool
	o.mu.Lock()
	parts := make([]int, 0, len(o.tensors)+1)
	for _, x := range o.tensors {
		parts = append(parts, x.n)
	}
	o.mu.Unlock()
	parts = append(parts, t.n)
	need := o.sz.need(parts)
	maxBuf, capBytes := int64(p.MaxBufferBytesFor(buffers.PurposeOptimizer)), p.CapacityBytesFor(buffers.PurposeOptimizer)
	if need.slot > maxBuf {
		return fmt.Errorf("%w: a sub-group's record and gradient need a %d-byte buffer; the largest the pool (%d bytes) holds is %d (lower SubGroupSize)",
			ErrPoolTooSmall, need.slot, capBytes, maxBuf)
	}
	if minimum := need.resident + need.slotBlock; minimum > capBytes {
		return fmt.Errorf("%w: a step of these tensors (%d elements in %d sub-groups) needs at least %d bytes of pinned memory (%d for records kept in memory, %d for one sub-group's buffer); the pool has %d",
			ErrPoolTooSmall, t.n, len(t.sgs), minimum, need.resident, need.slotBlock, capBytes)
	}
	return nil
}

// sizer computes the pinned buffers sub-groups take.
type sizer struct {
	store   *swapper.Store
	grads   GradSource
	granule int64
	sgSize  int
	arrays  int // of a record: the master and the rule's states
	format  StateFormat
	block   func(int64) int64
}

// newSizer sizes for opts (defaulted); block nil means opts.Pool's blocks.
func newSizer(opts Options, block func(int64) int64) sizer {
	z := sizer{store: opts.Store, grads: opts.Grads, granule: 1, sgSize: opts.SubGroupSize, arrays: 1 + opts.Hyper.StateCount(), format: opts.StateFormat, block: block}
	if opts.StateFormatFor != nil {
		z.format = FormatFP32 // per tensor: the widest
	}
	switch {
	case opts.Pool != nil:
		z.granule = int64(opts.Pool.MinBufferBytes())
	case opts.Store != nil:
		z.granule = opts.Store.Alignment()
	}
	if z.block == nil {
		z.block = BlockBytes(opts.Pool)
	}
	return z
}

// recRegion is the part of a sub-group's buffer its record is read into
// (with a Store): padded for the store and rounded up to the pool's
// granule, so the gradient slice after it starts as aligned as a pool
// buffer does.
func (z sizer) recRegion(n int) int64 {
	if z.store == nil {
		return 0
	}
	return roundUp(z.store.PaddedLen(LayoutForFormat(n, z.arrays, z.format).Bytes), z.granule)
}

// slot is the buffer a step takes for the sub-group [lo, hi) of a tensor:
// its record region and the gradient source's range buffer.
func (z sizer) slot(lo, hi int) int64 {
	g := 4 * int64(hi-lo)
	if z.grads != nil {
		g = max(g, int64(z.grads.RangeBufferBytes(lo, hi)))
	}
	return z.recRegion(hi-lo) + g
}

// needs are the pinned memory of a set of tensors.
type needs struct {
	resident  int64 // blocks of the records kept in pinned memory (no Store)
	slot      int64 // the largest sub-group buffer, in bytes requested
	slotBlock int64 // the block it takes
	subGroups int
}

func (z sizer) need(parts []int) needs {
	var nd needs
	for _, n := range parts {
		for off := 0; off < n; off += z.sgSize {
			m := min(z.sgSize, n-off)
			nd.subGroups++
			if z.store == nil {
				nd.resident += 2 * z.block(LayoutForFormat(m, z.arrays, z.format).Bytes)
			}
			s := z.slot(off, off+m)
			nd.slot = max(nd.slot, s)
			nd.slotBlock = max(nd.slotBlock, z.block(s))
		}
	}
	return nd
}

func roundUp(n, to int64) int64 { return (n + to - 1) / to * to }

// inFlight is the most sub-groups a step holds buffers for at once: one
// without a pipeline; with depth k, k read ahead, one updating and k
// being written behind (the write slots bound the last), and never more
// than BufferCount.
func inFlight(opts Options) int {
	if opts.PipelineDepth == 0 {
		return 1
	}
	return min(opts.BufferCount, 2*opts.PipelineDepth+1)
}

// MaxPipelineDepth is the deepest pipeline a step runs
// (zinf.pipeline_depth's limit).
const MaxPipelineDepth = 16

// AutoPipelineDepth is the depth at which a step of an optimizer with
// opts keeps about inFlightBytes of sub-group buffers read ahead, and as
// many written behind, for partitions of the given lengths (this rank's):
// inFlightBytes over the largest sub-group's block (blockBytes as for
// PinnedNeedBytes), rounded up, at least 1 and at most MaxPipelineDepth.
// Sub-groups of tens of MiB keep depth 1; records of a few hundred KiB
// go to the disk a dozen or more at a time. The buffer sets that depth
// wants are 2*depth+1 (see BufferCount); PinnedNeedBytes of opts with
// that depth and BufferCount is the pinned memory it takes.
func AutoPipelineDepth(opts Options, partitionElems []int, blockBytes func(int64) int64, inFlightBytes int64) int {
	opts.EnsureDefaults()
	nd := newSizer(opts, blockBytes).need(partitionElems)
	if nd.slotBlock <= 0 || inFlightBytes <= 0 {
		return 1
	}
	return int(max(1, min(MaxPipelineDepth, (inFlightBytes+nd.slotBlock-1)/nd.slotBlock)))
}

// PinnedNeedBytes is the most pinned memory an optimizer with opts holds
// at once for partitions of the given lengths (this rank's, in any order),
// counted in the blocks the pool reserves (blockBytes maps a request's
// bytes to the bytes it takes; nil means opts.Pool's buddy blocks, see
// BlockBytes, or the request itself without a Pool). A pool of that size,
// used by nothing else during the step, lets every step through without
// waiting; the planner adds it to the other swappers' needs.
//
// It is independent of the largest tensor: a step holds, per sub-group in
// flight (1 with PipelineDepth 0, else min(BufferCount,
// 2*PipelineDepth+1)), one buffer with the sub-group's record (with a
// Store; 12 bytes per element, plus the stagger of large sub-groups: see
// LayoutFor) and its gradient slice (opts.Grads' RangeBufferBytes, at
// least 4 bytes per element), and nothing per tensor: new parameters go to
// a RangeSink sub-group by sub-group (to a plain ParamSink a tensor of
// several sub-groups is assembled in ordinary, unpinned memory). The
// workers an update is split over (UpdateWorkers) share its buffer: they
// cost no pinned memory. Without a Store the two copies of every record
// (about 24 bytes per element) stay in the pool besides. Not counted: buffers held
// by StateSnapshots, which a step replaces with fresh ones (see
// SnapshotStates). Empty partitions cost nothing.
func PinnedNeedBytes(opts Options, partitionElems []int, blockBytes func(int64) int64) int64 {
	opts.EnsureDefaults()
	z := newSizer(opts, blockBytes)
	nd := z.need(partitionElems)
	return nd.resident + int64(min(inFlight(opts), nd.subGroups))*nd.slotBlock
}

// BlockBytes returns the bytes p's buddy allocator reserves for a request
// of n bytes, in the worst case of fragmentation: the pool's own rule,
// buffers.SpanBytes with p's granule (MinBufferBytes). A pool sized as the
// sum of such blocks holds the requests whatever order they are given
// back in. A nil pool gives n itself.
func BlockBytes(p *buffers.Pool) func(int64) int64 {
	if p == nil {
		return func(n int64) int64 { return max(n, 0) }
	}
	g := p.MinBufferBytes()
	return func(n int64) int64 { return buffers.SpanBytes(n, g) }
}

// writeInitial stores the master and the rule's initial states (Adam:
// [master | 0 | 0]) for every sub-group of t. On failure nothing of t is
// left behind.
func (o *Optimizer) writeInitial(t *tensor, master []float32) error {
	return o.writeStates(context.Background(), t, master, nil, false)
}

// writeStates writes the given states (nil: the rule's initial states)
// for every sub-group of t. With a store the records go to the current
// names directly (fresh is true at Register) or, when replacing existing
// states, to staging names renamed at once at the end, so a failure leaves
// t as it was. In pinned memory the records are acquired (fresh) or
// overwritten.
func (o *Optimizer) writeStates(ctx context.Context, t *tensor, master []float32, states [][]float32, replace bool) error {
	h := o.opts.Hyper
	fill := func(rec []float32, sg *subGroup) {
		lo, hi := sg.off, sg.off+sg.n
		for _, pad := range sg.lay.pads(rec) {
			clear(pad)
		}
		copy(sg.lay.array(rec, 0), master[lo:hi])
		var init []float32
		for k := 1; k < sg.lay.Arrays; k++ {
			if states != nil {
				sg.lay.encode(rec, k, states[k-1][lo:hi])
				continue
			}
			if !sg.lay.compressed() {
				a := sg.lay.array(rec, k)
				v := h.initialState(k - 1)
				for i := range a {
					a[i] = v
				}
				continue
			}
			if init == nil {
				init = make([]float32, sg.n) // zeros: Adam's initial moments
			}
			sg.lay.encode(rec, k, init)
		}
	}
	return o.writeRecords(ctx, t, fill, replace)
}

// writeRecords writes the records fill builds for every sub-group of t,
// as writeStates describes.
func (o *Optimizer) writeRecords(ctx context.Context, t *tensor, fill func([]float32, *subGroup), replace bool) error {
	st := o.opts.Store
	if st == nil {
		if replace {
			return o.replaceInMemory(ctx, t, fill)
		}
		for _, sg := range t.sgs {
			for k := range sg.mem {
				b, ok := o.opts.Pool.TryAcquire(sg.recordBytes(), buffers.PurposeOptimizer)
				if !ok {
					o.releaseMem(t)
					return fmt.Errorf("%w: no %d bytes free for sub-group %d's states in pinned memory (states kept in memory take %d bytes per element; free: %d bytes)",
						ErrPoolTooSmall, sg.recordBytes(), sg.j, 8*o.width, o.opts.Pool.Stats().FreeBytes)
				}
				sg.mem[k] = b
			}
			fill(sg.mem[0].Float32(), sg)
		}
		return nil
	}
	var written []string
	undo := func() {
		for _, k := range written {
			st.Delete(k)
		}
	}
	for _, sg := range t.sgs {
		b, err := o.opts.Pool.Acquire(ctx, o.bufBytes(sg.recordBytes()), buffers.PurposeOptimizer)
		if err != nil {
			undo()
			return err
		}
		rec := b.Bytes()[:sg.recordBytes()]
		fill(buffers.Float32Bytes(rec), sg)
		key := sg.key
		if replace {
			key = sg.staged()
		}
		err = st.Write(ctx, key, rec)
		b.Release()
		if err != nil {
			undo()
			return err
		}
		written = append(written, key)
	}
	if replace {
		pairs := make([][2]string, len(t.sgs))
		for i, sg := range t.sgs {
			pairs[i] = [2]string{sg.staged(), sg.key}
		}
		if err := st.Rename(pairs...); err != nil {
			undo()
			return err
		}
	}
	return nil
}

// replaceInMemory overwrites t's current records (states in pinned
// memory) with fill. A record held by a StateSnapshot is not touched: a
// fresh buffer replaces it, all of them acquired (waiting under ctx) before
// anything changes, so a failure leaves t as it was.
func (o *Optimizer) replaceInMemory(ctx context.Context, t *tensor, fill func([]float32, *subGroup)) error {
	fresh := make([]*buffers.Buffer, len(t.sgs))
	for i, sg := range t.sgs {
		o.memMu.Lock()
		held := sg.held[sg.cur] > 0
		o.memMu.Unlock()
		if !held {
			continue
		}
		b, err := o.opts.Pool.Acquire(ctx, sg.recordBytes(), buffers.PurposeOptimizer)
		if err != nil {
			for _, b := range fresh {
				if b != nil {
					b.Release()
				}
			}
			return err
		}
		fresh[i] = b
	}
	for i, sg := range t.sgs {
		if fresh[i] == nil {
			fill(sg.mem[sg.cur].Float32(), sg)
			continue
		}
		fill(fresh[i].Float32(), sg)
		o.memMu.Lock()
		old := sg.mem[sg.cur]
		sg.mem[sg.cur], sg.held[sg.cur] = fresh[i], 0
		o.memMu.Unlock()
		old.Release() // the sub-group's reference; the snapshots keep theirs
	}
	return nil
}

// releaseMem drops the sub-groups' references to their records (snapshots
// keep theirs).
func (o *Optimizer) releaseMem(t *tensor) {
	o.memMu.Lock()
	defer o.memMu.Unlock()
	for _, sg := range t.sgs {
		for k, b := range sg.mem {
			if b != nil {
				b.Release()
				sg.mem[k] = nil
			}
			sg.held[k] = 0
		}
	}
}

// Names returns the registered tensor names, in registration order.
func (o *Optimizer) Names() []string {
	o.mu.Lock()
	defer o.mu.Unlock()
	out := make([]string, len(o.tensors))
	for i, t := range o.tensors {
		out[i] = t.name
	}
	return out
}

// StepCount returns the number of committed steps (or the step loaded by
// LoadState, plus the steps committed since).
func (o *Optimizer) StepCount() int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.step
}

// Stats returns a snapshot of the optimizer's counters.
func (o *Optimizer) Stats() Stats {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.stats
}

func (o *Optimizer) lookup(name string) (*tensor, bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	t, ok := o.byName[name]
	return t, ok
}

// ReadState returns copies of a tensor's master weights, exp_avg and
// exp_avg_sq as of the last committed step, for verification and
// checkpoints; during an open step transaction too. For a rule with fewer
// states the missing ones are nil (ReadStates returns them all). The
// slices are freshly allocated and belong to the caller.
func (o *Optimizer) ReadState(ctx context.Context, name string) (master, expAvg, expAvgSq []float32, err error) {
	master, st, err := o.ReadStates(ctx, name)
	if err != nil {
		return nil, nil, nil, err
	}
	if len(st) > 0 {
		expAvg = st[0]
	}
	if len(st) > 1 {
		expAvgSq = st[1]
	}
	return master, expAvg, expAvgSq, nil
}

// ReadStates returns copies of a tensor's master weights and of its
// rule's states (Hyper.StateNames order) as of the last committed step.
func (o *Optimizer) ReadStates(ctx context.Context, name string) (master []float32, states [][]float32, err error) {
	n, err := o.elems(name)
	if err != nil {
		return nil, nil, &Error{Op: "read-state", Tensor: name, SubGroup: -1, Err: err}
	}
	master = make([]float32, n)
	states = make([][]float32, o.width-1)
	for k := range states {
		states[k] = make([]float32, n)
	}
	err = o.VisitStates(ctx, name, func(off int, m []float32, st [][]float32) error {
		copy(master[off:], m)
		for k := range states {
			copy(states[k][off:], st[k])
		}
		return nil
	})
	if err != nil {
		return nil, nil, err
	}
	return master, states, nil
}

// elems returns a registered tensor's element count.
func (o *Optimizer) elems(name string) (int, error) {
	o.opMu.Lock()
	defer o.opMu.Unlock()
	if o.closed {
		return 0, ErrClosed
	}
	t, ok := o.lookup(name)
	if !ok {
		return 0, ErrNotRegistered
	}
	return t.n, nil
}

// VisitStates calls fn for each sub-group of a tensor, in order, with the
// offset of its first element in the tensor and its master weights and
// rule's states (Hyper.StateNames order) as of the last committed step.
// The slices are the sub-group's record in pinned memory (or the states
// themselves, when they are kept in pinned memory): valid only during the
// call, and not to be written. Unlike ReadStates it holds no copy of the
// tensor, only one sub-group's record at a time, so a caller that wants a
// few elements of a large tensor reads them in bounded memory. An error
// from fn stops the visit and is returned.
func (o *Optimizer) VisitStates(ctx context.Context, name string, fn func(off int, master []float32, states [][]float32) error) error {
	var wide [][]float32 // compressed states, decoded
	return o.visitRecords(ctx, name, func(sg *subGroup, rec []float32) error {
		if !sg.lay.compressed() {
			arrays := sg.arrays(rec)
			return fn(sg.off, arrays[0], arrays[1:])
		}
		if wide == nil {
			wide = make([][]float32, o.width-1)
			for k := range wide {
				wide[k] = make([]float32, min(o.opts.SubGroupSize, sg.t.n))
			}
		}
		st := make([][]float32, len(wide))
		for k := range st {
			st[k] = wide[k][:sg.n]
			sg.lay.decode(st[k], rec, k+1)
		}
		return fn(sg.off, sg.lay.array(rec, 0), st)
	})
}

// visitRecords calls fn with each sub-group of a tensor, in order, and
// its committed record (valid only during the call, not to be written),
// as VisitStates describes.
func (o *Optimizer) visitRecords(ctx context.Context, name string, fn func(sg *subGroup, rec []float32) error) error {
	o.opMu.Lock()
	defer o.opMu.Unlock()
	fail := func(sg int, err error) error {
		return &Error{Op: "read-state", Tensor: name, SubGroup: sg, Err: err}
	}
	if o.closed {
		return fail(-1, ErrClosed)
	}
	t, ok := o.lookup(name)
	if !ok {
		return fail(-1, ErrNotRegistered)
	}
	out := func(rec []float32, sg *subGroup) error { return fn(sg, rec) }
	for _, sg := range t.sgs {
		if o.opts.Store == nil {
			if err := out(sg.mem[sg.cur].Float32(), sg); err != nil {
				return err
			}
			continue
		}
		b, err := o.opts.Pool.Acquire(ctx, o.bufBytes(sg.recordBytes()), buffers.PurposeOptimizer)
		if err != nil {
			return fail(sg.j, err)
		}
		rec := b.Bytes()[:sg.recordBytes()]
		if err := o.opts.Store.Read(ctx, sg.key, rec); err != nil {
			b.Release()
			return fail(sg.j, err)
		}
		err = out(buffers.Float32Bytes(rec), sg)
		b.Release()
		if err != nil {
			return err
		}
	}
	return nil
}

// LoadState replaces a registered Adam tensor's states (from a
// checkpoint): LoadStates with exp_avg and exp_avg_sq.
func (o *Optimizer) LoadState(ctx context.Context, name string, master, expAvg, expAvgSq []float32, step int) error {
	return o.LoadStates(ctx, name, master, [][]float32{expAvg, expAvgSq}, step)
}

// LoadStates replaces a registered tensor's states (from a checkpoint) and
// sets the step counter, which all tensors share, to step: load every
// tensor with the checkpoint's step. master and each of the rule's states
// (Hyper.StateNames order) must have the tensor's partition length. With a
// store the new states are staged and renamed at once, so a failure
// leaves the tensor's states as they were.
func (o *Optimizer) LoadStates(ctx context.Context, name string, master []float32, states [][]float32, step int) error {
	o.opMu.Lock()
	defer o.opMu.Unlock()
	fail := func(err error) error { return &Error{Op: "load", Tensor: name, SubGroup: -1, Err: err} }
	if o.closed {
		return fail(ErrClosed)
	}
	if o.txn != nil {
		return fail(ErrStepOpen)
	}
	t, ok := o.lookup(name)
	if !ok {
		return fail(ErrNotRegistered)
	}
	if len(states) != o.width-1 {
		return fail(fmt.Errorf("%w: %s keeps %d states (%v); got %d", ErrLength, o.opts.Hyper.Rule, o.width-1, o.opts.Hyper.StateNames(), len(states)))
	}
	for k, st := range states {
		if len(st) != t.n {
			return fail(fmt.Errorf("%w: the partition has %d elements; got %s %d", ErrLength, t.n, o.opts.Hyper.StateNames()[k], len(st)))
		}
	}
	return o.loadLocked(ctx, t, master, step, func(rec []float32, sg *subGroup) {
		for k := 1; k < sg.lay.Arrays; k++ {
			sg.lay.encode(rec, k, states[k-1][sg.off:sg.off+sg.n])
		}
	})
}

// loadWith replaces a registered tensor's records: master and the states
// fillStates writes into each sub-group's record, and sets the step
// counter (LoadStates' contract).
func (o *Optimizer) loadWith(ctx context.Context, name string, master []float32, step int, fillStates func(rec []float32, sg *subGroup)) error {
	o.opMu.Lock()
	defer o.opMu.Unlock()
	fail := func(err error) error { return &Error{Op: "load", Tensor: name, SubGroup: -1, Err: err} }
	if o.closed {
		return fail(ErrClosed)
	}
	if o.txn != nil {
		return fail(ErrStepOpen)
	}
	t, ok := o.lookup(name)
	if !ok {
		return fail(ErrNotRegistered)
	}
	return o.loadLocked(ctx, t, master, step, fillStates)
}

// loadLocked is loadWith on t, with opMu held.
func (o *Optimizer) loadLocked(ctx context.Context, t *tensor, master []float32, step int, fillStates func(rec []float32, sg *subGroup)) error {
	fail := func(err error) error { return &Error{Op: "load", Tensor: t.name, SubGroup: -1, Err: err} }
	if len(master) != t.n {
		return fail(fmt.Errorf("%w: the partition has %d elements; got master %d", ErrLength, t.n, len(master)))
	}
	if step < 0 {
		return fail(fmt.Errorf("step %d is negative", step))
	}
	fill := func(rec []float32, sg *subGroup) {
		for _, pad := range sg.lay.pads(rec) {
			clear(pad)
		}
		copy(sg.lay.array(rec, 0), master[sg.off:sg.off+sg.n])
		fillStates(rec, sg)
	}
	if err := o.writeRecords(ctx, t, fill, true); err != nil {
		return fail(err)
	}
	o.mu.Lock()
	o.step = step
	o.mu.Unlock()
	return nil
}

// Close drops the optimizer's states: their records are deleted from the
// store (the Store itself stays open: it belongs to the caller) or their
// pinned buffers released. An open step transaction is aborted first
// (waiting for its I/O in flight); its Commit then fails with ErrClosed.
// Later calls fail with ErrClosed.
func (o *Optimizer) Close() error {
	o.opMu.Lock()
	defer o.opMu.Unlock()
	if o.closed {
		return ErrClosed
	}
	if o.txn != nil {
		o.txn.abortForClose()
	}
	o.closed = true
	o.mu.Lock()
	defer o.mu.Unlock()
	for _, t := range o.tensors {
		if o.opts.Store == nil {
			o.releaseMem(t)
			continue
		}
		for _, sg := range t.sgs {
			o.opts.Store.Delete(sg.key)
			o.opts.Store.Delete(sg.staged())
			o.opts.Store.Delete(sg.prev())
		}
	}
	o.opts.Logger.Debug("optimizer: closed", slog.Int("tensors", len(o.tensors)), slog.Int("steps", o.step))
	return nil
}

// StateRecord is one sub-group's committed record in the optimizer's store,
// under store key Key: Elems fp32 values each of the master and the rule's
// states (Adam: exp_avg, exp_avg_sq), where Layout says.
type StateRecord struct {
	Key    string
	Elems  int
	Layout RecordLayout
}

// StateRecords lists the records holding name's committed states, in
// element order, for readers that stream them straight from the store
// (checkpoints pin and read them without going through ReadState). ok is
// false when the states are kept in pinned memory, stored narrower than
// fp32 (Options.StateFormat) or name is unknown.
func (o *Optimizer) StateRecords(name string) (recs []StateRecord, ok bool) {
	if o.opts.Store == nil {
		return nil, false
	}
	t, found := o.lookup(name)
	if !found || t.format.Encoding != EncodingFP32 {
		return nil, false
	}
	for _, sg := range t.sgs {
		recs = append(recs, StateRecord{Key: sg.key, Elems: sg.n, Layout: sg.lay})
	}
	return recs, true
}

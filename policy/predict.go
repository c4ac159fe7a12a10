package policy

import (
	"math"
	"time"
)

// Compute split between the passes: the backward pass computes the
// gradients with respect to both the inputs and the weights, twice the
// forward pass's work, so a layer's forward+backward time is split 1:2.
const (
	forwardShare  = 1.0 / 3
	backwardShare = 2.0 / 3
)

// maxAutoDepth bounds the depth the policy searches (and the config's
// zinf.prefetch_depth range): beyond it the search costs more than it can
// save.
const maxAutoDepth = 1024

// DefaultPrefetchDepth is the depth used when the NVMe read bandwidth is
// unknown and the depth cannot be sized from it.
const DefaultPrefetchDepth = 2

// StepPrediction is the predicted time of one training step (one forward,
// one backward pass and one optimizer step).
type StepPrediction struct {
	// Compute is forward+backward compute over all layers.
	Compute time.Duration
	// ParamIO is the time to bring offloaded parameters in for both passes
	// (NVMe reads and host-to-device copies), hidden or not.
	ParamIO time.Duration
	// ExposedParamIO is the part of ParamIO compute waits for.
	ExposedParamIO time.Duration
	// GradIO is the write-behind of offloaded gradients during backward,
	// their read-backs, and the hand-offs' arithmetic (Hints.Costs).
	GradIO time.Duration
	// ExposedGradIO is the part of GradIO still running when backward ends.
	ExposedGradIO time.Duration
	// OptimizerIO is the optimizer step's traffic: offloaded states and
	// gradients read and states written at NVMe bandwidth, updated
	// parameters written back, and the copies across PCIe, with the
	// optimizer's arithmetic and checksums when Hints.Costs gives them.
	OptimizerIO time.Duration
	// ExposedOptimizer is the part of the optimizer step the step waits
	// for: all of it (OptimizerIO) when the step runs after backward, what
	// runs past the backward pass when it overlaps it (Overlapped).
	ExposedOptimizer time.Duration
	// Overlapped says the optimizer step overlaps the last backward pass
	// (Placement.OverlapStep): each layer's update runs once its gradient
	// is final, sharing the disk with the pass.
	Overlapped bool
	// Total is Compute + ExposedParamIO + ExposedGradIO + ExposedOptimizer.
	Total time.Duration
	// Phases breaks Total down: forward, backward, optimizer.
	Phases []Phase
	// NVMeReadBytes and NVMeWriteBytes are what one step moves from and
	// to this rank's NVMe paths: offloaded parameters fetched in both
	// passes, gradients written behind and read back, optimizer states
	// read and written, updated parameters written back. NVMeWriteBytes
	// is what a step costs the drives' endurance (see Endurance).
	NVMeReadBytes, NVMeWriteBytes int64
}

// Phase is one phase of a step.
type Phase struct {
	Name string
	// Compute is the phase's compute time.
	Compute time.Duration
	// IO is the phase's I/O time, hidden or not.
	IO time.Duration
	// Exposed is the I/O time the phase waits for.
	Exposed time.Duration
	// Total is Compute + Exposed.
	Total time.Duration
}

// passResult is the outcome of simulating one pass, in seconds.
type passResult struct {
	io        float64 // fetch and write time issued in the pass
	exposed   float64 // time compute waited on fetches
	drain     float64 // time writes ran past the end of the pass
	readBack  float64 // time the loop waited reading gradients back (read-modify-write)
	writeWait float64 // time the loop waited for gradient writes (syncWrite)
	handOff   float64 // time the loop spent in hand-off arithmetic
	end       float64 // when the pass's last work (loop, I/O, updates) ended
}

// simulatePass models one pass the way Scheduler runs it. Reads (parameter
// fetches) and writes (gradient write-behind) share one FIFO queue, the
// disk: a read takes its bytes over the read bandwidth, a write its bytes
// over the write bandwidth, one after the other (a drive reading and
// writing at once splits its time between them; modelling them as two
// independent streams predicted make bench-schedule's disk-bound steps
// 20-35% short once the optimizer's traffic overlaps the backward pass).
// Begin(j) fetches layer j on demand if it was not prefetched, waits for
// it, then queues the fetches of the next depth layers; the layer then
// computes for compute seconds and queues its write-behind. Compute waits
// only while the disk is busy. With readBack (a micro-batch-major
// backward pass after the first micro-batch), each layer's hand-off first
// reads its gradient sum back and the loop waits for it. With bufs > 0
// (gradients handed over one at a time: the write-behind has bufs pinned
// buffers) a layer's hand-off first waits for a buffer, given back by the
// write issued bufs hand-offs before; bufs 0: as many as there are
// layers (layer-major holds a layer's sums). handOff (nil:
// none) is each layer's hand-off arithmetic after its compute: the copies
// and additions of its gradients into their pinned sums, which the loop
// waits for.
func simulatePass(order []int, fetch, write, readBack, handOff []float64, compute float64, depth int, bufs ...int) passResult {
	n := 0
	if len(bufs) > 0 {
		n = bufs[0]
	}
	return simulatePassStep(order, fetch, write, readBack, handOff, compute, depth, n, nil)
}

// optJobs is the optimizer's work per layer when it overlaps a backward
// pass (Placement.OverlapStep): each layer's update starts once its
// gradients are handed off, reads its states and gradients from the disk,
// computes on the update goroutine, one layer after another, and writes
// behind.
type optJobs struct {
	read, arith, write []float64
	// readCRC and writeCRC are the checksum time (zinf.checksums) of
	// each layer's reads (verified once read, before the update) and
	// writes (summed before the write is issued): CPU time on the update's
	// path, not the disk's, which goes on with the sub-groups the
	// optimizer's pipeline has queued (nil: none).
	readCRC, writeCRC []float64
}

// at is x[l], or 0 when x is nil.
func at(x []float64, l int) float64 {
	if x == nil {
		return 0
	}
	return x[l]
}

// simulatePassStep is simulatePass with the optimizer's updates of opt
// (nil: none) overlapping it: passResult.end is then when the last update
// was written.
func simulatePassStep(order []int, fetch, write, readBack, handOff []float64, compute float64, depth int, bufs int, opt *optJobs) passResult {
	var r passResult
	now, disk := 0.0, 0.0 // disk: when the device is free (reads and writes share it)
	// The optimizer's writes wait for their update: they join the disk's
	// queue, in order, once the loop's time reaches them.
	optFree, gradEnd := 0.0, 0.0
	type pendingWrite struct{ at, d float64 }
	var optWrites []pendingWrite
	flushOpt := func(upTo float64) {
		for len(optWrites) > 0 && optWrites[0].at <= upTo {
			w := optWrites[0]
			optWrites = optWrites[1:]
			disk = math.Max(disk, w.at) + w.d
		}
	}
	done := make([]float64, len(order))
	var writeEnds []float64 // when each gradient write issued ends
	issued := 0             // positions [0, issued) have been queued
	issue := func(pos int) {
		l := order[pos]
		disk = math.Max(disk, now) + fetch[l]
		done[pos] = disk
		r.io += fetch[l]
		issued = pos + 1
	}
	for j := range order {
		flushOpt(now)
		if issued <= j {
			issue(j) // demand miss
		}
		if wait := done[j] - now; wait > 0 {
			r.exposed += wait
			now = done[j]
		}
		for k := issued; k < len(order) && k <= j+depth; k++ {
			issue(k)
		}
		now += compute
		if w := write; bufs > 0 && w != nil && w[order[j]] > 0 && len(writeEnds) >= bufs {
			// The hand-off's buffer comes back with the write bufs
			// hand-offs before.
			if free := writeEnds[len(writeEnds)-bufs]; free > now {
				r.writeWait += free - now
				now = free
			}
		}
		if handOff != nil {
			now += handOff[order[j]]
			r.handOff += handOff[order[j]]
		}
		if readBack != nil {
			if rb := readBack[order[j]]; rb > 0 {
				// The previous write of the gradient is long done (a whole
				// pass ago); the read queues behind the prefetches.
				end := math.Max(disk, now) + rb
				disk = end
				r.readBack += end - now
				r.io += rb
				now = end
			}
		}
		if write != nil {
			if w := write[order[j]]; w > 0 {
				flushOpt(now)
				disk = math.Max(disk, now) + w
				gradEnd = disk
				writeEnds = append(writeEnds, disk)
				r.io += w
			}
		}
		if opt != nil {
			flushOpt(now)
			l := order[j]
			disk = math.Max(disk, now) + opt.read[l]
			optFree = math.Max(optFree, disk+at(opt.readCRC, l)) + opt.arith[l]
			if opt.write[l] > 0 {
				optWrites = append(optWrites, pendingWrite{at: optFree + at(opt.writeCRC, l), d: opt.write[l]})
			}
		}
	}
	if gradEnd > now {
		r.drain = gradEnd - now
	}
	r.end = now + r.drain
	if opt != nil {
		flushOpt(math.Inf(1))
		r.end = math.Max(r.end, math.Max(disk, optFree))
	}
	return r
}

// stepModel holds the per-layer times a prediction is made from.
type stepModel struct {
	layers     int
	micro      int       // micro-batches per step (>= 1)
	compute    float64   // seconds per layer and micro-batch, forward+backward
	fetch      []float64 // seconds to bring a layer's offloaded params in
	gradWrite  []float64 // seconds to move a layer's offloaded grads out
	gradRead   []float64 // seconds to read a layer's NVMe grads back
	handOff    []float64 // seconds of one micro-batch's gradient hand-offs of a layer (nil: none)
	gradBufs   int       // gradient write-behinds in flight at once when handed over one at a time (>= 1)
	optimizerS float64   // optimizer step I/O seconds
	// overlap says the optimizer step overlaps the (last) backward pass,
	// opt its work per layer then (Placement.OverlapStep).
	overlap bool
	opt     optJobs
	// nvmeRead and nvmeWrite are the optimizer step's NVMe bytes (states,
	// gradients read back, parameters written back); paramRead and
	// gradBytes are one pass's NVMe parameter bytes and one write of the
	// NVMe gradients.
	nvmeRead, nvmeWrite  int64
	paramRead, gradBytes int64
}

// passes simulates one forward and one backward pass of a single
// micro-batch.
func (m *stepModel) passes(depth int) (fwd, bwd passResult) {
	forward, backward := m.orders()
	fwd = m.pass(forward, false, false, nil, m.compute*forwardShare, depth, 0, nil)
	bwd = m.pass(backward, true, false, m.handOffs(1), m.compute*backwardShare, depth, 0, nil)
	return fwd, bwd
}

// pass simulates one pass over order with the model's fetches, its
// gradient writes (writes) and read-backs (readBack).
func (m *stepModel) pass(order []int, writes, readBack bool, handOff []float64, compute float64, depth, bufs int, opt *optJobs) passResult {
	var w, rb []float64
	if writes {
		w = m.gradWrite
	}
	if readBack {
		rb = m.gradRead
	}
	return simulatePassStep(order, m.fetch, w, rb, handOff, compute, depth, bufs, opt)
}

// handOffs is each layer's hand-off time for n micro-batches (nil when
// none is modelled).
func (m *stepModel) handOffs(n float64) []float64 {
	var out []float64
	for l, h := range m.handOff {
		if h > 0 {
			if out == nil {
				out = make([]float64, len(m.handOff))
			}
			out[l] = h * n
		}
	}
	return out
}

func (m *stepModel) orders() (forward, backward []int) {
	forward = make([]int, m.layers)
	backward = make([]int, m.layers)
	for i := range forward {
		forward[i] = i
		backward[i] = m.layers - 1 - i
	}
	return forward, backward
}

func (m *stepModel) exposed(depth int) float64 {
	f, b := m.passes(depth)
	return f.exposed + b.exposed + b.drain
}

// autoDepth returns the smallest depth in [1, maxDepth] whose exposed I/O
// is as small as the deepest prefetch allows: deeper would only hold more
// pinned memory.
func (m *stepModel) autoDepth(maxDepth int) int {
	if maxDepth > maxAutoDepth {
		maxDepth = maxAutoDepth
	}
	if maxDepth < 1 {
		return 0
	}
	best := m.exposed(maxDepth)
	tol := 1e-9 + 1e-9*best
	// Exposure never grows with depth: a deeper window queues every fetch
	// no later, in the same FIFO order, so every fetch completes, every
	// layer starts and every write is queued no later, and the pass ends
	// no later. Binary search for the first depth that reaches the best.
	lo, hi := 0, maxDepth // exposed(lo) > best+tol (or lo = 0), exposed(hi) <= best+tol
	for lo+1 < hi {
		mid := lo + (hi-lo)/2
		if m.exposed(mid) <= best+tol {
			hi = mid
		} else {
			lo = mid
		}
	}
	return hi
}

func seconds(s float64) time.Duration {
	if s <= 0 || math.IsNaN(s) {
		return 0
	}
	if s > float64(math.MaxInt64)/float64(time.Second) {
		return time.Duration(math.MaxInt64)
	}
	return time.Duration(math.Round(s * float64(time.Second)))
}

// predict is the step of one micro-batch per step, where both orders are
// the same.
func (m *stepModel) predict(depth int) StepPrediction {
	k := m.micro
	m.micro = 1
	defer func() { m.micro = k }()
	return m.predictOrder(depth, false)
}

// predictOrder predicts a step of m.micro micro-batches in one order.
// Layer-major: one forward and one backward pass, each layer computing
// every micro-batch while its parameters are in, each gradient written
// once after its last micro-batch. Micro-batch-major: a forward and a
// backward pass per micro-batch; each backward pass after the first reads
// every NVMe gradient back before adding to it and writes it again.
func (m *stepModel) predictOrder(depth int, layerMajor bool) StepPrediction {
	k := max(m.micro, 1)
	forward, backward := m.orders()
	var f, b passResult
	var gradWrites, gradReads int64
	// With the optimizer step overlapping the last backward pass, each
	// layer's update runs behind that pass's hand-off of it.
	var opt *optJobs
	if m.overlap && len(m.opt.read) == m.layers {
		opt = &m.opt
	}
	// optDelay is how much later the last backward pass ends with the
	// overlapped updates than without them: the optimizer step's exposed
	// time (its traffic shares the disk with the pass).
	var optDelay float64
	if layerMajor {
		kk := float64(k)
		// At one micro-batch layer-major hands each gradient over once,
		// as micro-batch-major does; with more it holds a layer's sums.
		lmBufs := 0
		if k == 1 {
			lmBufs = m.gradBufs
		}
		f = m.pass(forward, false, false, nil, m.compute*forwardShare*kk, depth, 0, nil)
		b = m.pass(backward, true, false, m.handOffs(kk), m.compute*backwardShare*kk, depth, lmBufs, nil)
		if opt != nil {
			optDelay = m.pass(backward, true, false, m.handOffs(kk), m.compute*backwardShare*kk, depth, lmBufs, opt).end - b.end
		}
		gradWrites = 1
		k = 1 // passes
	} else {
		// Micro-batch-major hands gradients over one at a time: a hand-off
		// waits for a write-behind buffer.
		f1 := m.pass(forward, false, false, nil, m.compute*forwardShare, depth, 0, nil)
		b1 := m.pass(backward, true, false, m.handOffs(1), m.compute*backwardShare, depth, m.gradBufs, nil)
		f = passResult{io: f1.io * float64(k), exposed: f1.exposed * float64(k), drain: f1.drain * float64(k)}
		b = b1
		readBack := k > 1
		if readBack {
			bk := m.pass(backward, true, true, m.handOffs(1), m.compute*backwardShare, depth, m.gradBufs, nil)
			n := float64(k - 1)
			b = passResult{io: b1.io + n*bk.io, exposed: b1.exposed + n*bk.exposed, drain: b1.drain + n*bk.drain,
				readBack: n * bk.readBack, writeWait: b1.writeWait + n*bk.writeWait, handOff: b1.handOff + n*bk.handOff}
			b1 = bk // the last pass
		}
		if opt != nil {
			optDelay = m.pass(backward, true, readBack, m.handOffs(1), m.compute*backwardShare, depth, m.gradBufs, opt).end - b1.end
		}
		gradWrites, gradReads = int64(k), int64(k-1)
	}
	micro := float64(max(m.micro, 1))
	fc := seconds(m.compute * forwardShare * float64(m.layers) * micro)
	bc := seconds(m.compute * backwardShare * float64(m.layers) * micro)
	var sumFetch, sumWrite, sumRead float64
	for i := 0; i < m.layers; i++ {
		sumFetch += m.fetch[i]
		sumWrite += m.gradWrite[i]
		sumRead += m.gradRead[i]
	}
	passes := float64(k)
	p := StepPrediction{
		Compute:        fc + bc,
		ParamIO:        seconds(2 * passes * sumFetch),
		ExposedParamIO: seconds(f.exposed) + seconds(b.exposed),
		GradIO:         seconds(float64(gradWrites)*sumWrite + float64(gradReads)*sumRead + b.handOff),
		ExposedGradIO:  seconds(b.drain) + seconds(b.readBack) + seconds(b.writeWait) + seconds(b.handOff),
		OptimizerIO:    seconds(m.optimizerS),
		Overlapped:     opt != nil,
		NVMeReadBytes:  m.nvmeRead + 2*int64(k)*m.paramRead + gradReads*m.gradBytes,
		NVMeWriteBytes: m.nvmeWrite + gradWrites*m.gradBytes,
	}
	// Reads and writes share the disk, so a fetch may wait behind a
	// gradient write and a write behind fetches: the waits are the disk's
	// time either way, attributed to parameters up to their own I/O and
	// the rest to gradients.
	if exposed := p.ExposedParamIO + p.ExposedGradIO; p.ExposedParamIO > p.ParamIO || p.ExposedGradIO > p.GradIO {
		p.ExposedParamIO = min(exposed, p.ParamIO)
		p.ExposedGradIO = exposed - p.ExposedParamIO
	}
	p.ExposedOptimizer = p.OptimizerIO
	if opt != nil {
		p.ExposedOptimizer = min(seconds(optDelay), p.OptimizerIO)
	}
	p.Total = p.Compute + p.ExposedParamIO + p.ExposedGradIO + p.ExposedOptimizer
	p.Phases = []Phase{
		{Name: "forward", Compute: fc, IO: seconds(f.io), Exposed: seconds(f.exposed)},
		{Name: "backward", Compute: bc, IO: seconds(b.io), Exposed: seconds(b.exposed) + seconds(b.drain) + seconds(b.readBack) + seconds(b.writeWait) + seconds(b.handOff)},
		{Name: "optimizer", IO: p.OptimizerIO, Exposed: p.ExposedOptimizer},
	}
	for i := range p.Phases {
		p.Phases[i].Total = p.Phases[i].Compute + p.Phases[i].Exposed
	}
	return p
}

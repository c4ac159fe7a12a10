package zinf

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/zinfio/zinf/buffers"
	"github.com/zinfio/zinf/comm"
	"github.com/zinfio/zinf/plan"
	"github.com/zinfio/zinf/swapper/grad"
	"github.com/zinfio/zinf/tensor"
)

// distribute sets up what Options.Comm asks for: the collective worker,
// and with GatherLayers the gather state. Called by Open.
func (r *Runtime) distribute(opts Options) error {
	c := opts.Comm
	if c == nil {
		if opts.GatherLayers {
			return errors.New("zinf: Options.GatherLayers needs Options.Comm (this rank's comm.Comm)")
		}
		return nil
	}
	if c.Size() != r.World || c.Rank() != r.Rank {
		return fmt.Errorf("zinf: Options.Comm is rank %d of %d ranks; this runtime is rank %d of %d", c.Rank(), c.Size(), r.Rank, r.World)
	}
	r.comm = c
	r.cw = newCommWorker(c)
	r.gatherOn = opts.GatherLayers
	r.gather.order = make([]int, len(r.model.Layers))
	for l := range r.gather.order {
		r.gather.order[l] = l
	}
	return nil
}

// counts returns each rank's partition length of a tensor of numel
// elements, times elem.
func (r *Runtime) counts(numel int64, elem int) []int {
	out := make([]int, r.World)
	for q := range out {
		lo, hi := partition(int(numel), q, r.World)
		out[q] = (hi - lo) * elem
	}
	return out
}

// startGather acquires pinned memory for layer l's full parameters and
// queues its gather: the layer's partitions are made resident (the
// scheduler, which also prefetches the layers after it), copied into
// this rank's chunk of each full tensor, released, and all-gathered in
// place. Loop goroutine.
func (r *Runtime) startGather(ctx context.Context, l int, ahead bool) (*gatherSlot, error) {
	names := r.model.Layers[l]
	s := &gatherSlot{layer: l, names: names, bufs: make([]*buffers.Buffer, len(names)), ahead: ahead}
	elem := r.DType.Size()
	for i, n := range names {
		size := int(r.model.Numel[n]) * elem
		if size == 0 {
			continue
		}
		b, err := r.pool.Acquire(ctx, size, buffers.PurposeCollectives)
		if err != nil {
			s.release()
			return nil, fmt.Errorf("zinf: gathering layer %d: pinned memory for %q: %w", l, n, err)
		}
		s.bufs[i] = b
	}
	bg := r.bgCtx
	s.job = r.cw.submit(func() error {
		t0 := time.Now()
		err := r.gatherLayer(bg, s)
		r.mu.Lock()
		r.commStats.GatherTime += time.Since(t0)
		r.mu.Unlock()
		if err != nil {
			var re *comm.RankError
			if !errors.As(err, &re) {
				// This rank cannot take part in the rest of the
				// collectives: the others must not wait for it.
				r.comm.Abort(fmt.Errorf("rank %d: gathering layer %d: %w", r.Rank, s.layer, err))
			}
		}
		return err
	})
	return s, nil
}

// gatherLayer runs on the collective worker.
func (r *Runtime) gatherLayer(ctx context.Context, s *gatherSlot) error {
	elem := r.DType.Size()
	if err := r.sched.Begin(ctx, s.layer); err != nil {
		return fmt.Errorf("zinf: gathering layer %d: %w", s.layer, err)
	}
	type part struct {
		own, full []byte
		counts    []int
	}
	parts := make([]part, len(s.names))
	var err error
	for i, n := range s.names {
		if s.bufs[i] == nil {
			continue
		}
		counts := r.counts(r.model.Numel[n], elem)
		off, total := comm.Offsets(counts)
		full := s.bufs[i].Bytes()[:total]
		own := full[off[r.Rank] : off[r.Rank]+counts[r.Rank]]
		parts[i] = part{own: own, full: full, counts: counts}
		if err == nil && len(own) > 0 {
			err = r.Params.ReadBytes(ctx, n, own)
		}
	}
	r.sched.End(s.layer) // the partitions are copied: the swapper may reuse their memory
	if err != nil {
		return fmt.Errorf("zinf: gathering layer %d: %w", s.layer, err)
	}
	for i, n := range s.names {
		p := parts[i]
		if p.full == nil {
			continue
		}
		if err := r.comm.AllGather(ctx, p.own, p.full, p.counts); err != nil {
			return fmt.Errorf("zinf: gathering %q (layer %d): %w", n, s.layer, err)
		}
		r.mu.Lock()
		r.commStats.Gathers++
		r.commStats.GatherSent += int64(len(p.own)) * int64(r.World-1)
		r.commStats.GatherReceived += int64(len(p.full) - len(p.own))
		r.mu.Unlock()
	}
	return nil
}

// dropSlot waits for a slot's gather (a collective is never abandoned
// while the world lives) and frees its memory.
func (r *Runtime) dropSlot(s *gatherSlot) {
	if s.job != nil {
		<-s.job.done
	}
	s.release()
	r.gather.slots = slices.DeleteFunc(r.gather.slots, func(x *gatherSlot) bool { return x == s })
}

// dropAhead drops the layers gathered ahead and not begun (a new pass
// that does not start with them, a step that changes the parameters).
// keep, when >= 0, is a layer to keep if it is the one gathered ahead.
func (r *Runtime) dropAhead(keep int) {
	for _, s := range slices.Clone(r.gather.slots) {
		if !s.held && s.layer != keep {
			r.dropSlot(s)
		}
	}
}

// gatherPass records a new pass order (GatherLayers); repeat: the pass
// after it is the same.
func (r *Runtime) gatherPass(order []int, repeat bool) {
	r.gather.repeat = repeat
	r.gather.order = r.gather.order[:0]
	for _, l := range order {
		if l >= 0 && l < len(r.model.Layers) {
			r.gather.order = append(r.gather.order, l)
		}
	}
	r.gather.pos = 0
	first := -1
	if len(r.gather.order) > 0 {
		first = r.gather.order[0]
	}
	r.dropAhead(first)
}

// beginGathered is BeginLayer with GatherLayers: layer l's full
// parameters, gathered ahead or now, then the gather of the next layer
// of the pass started.
func (r *Runtime) beginGathered(ctx context.Context, l int) error {
	g := &r.gather
	for i := g.pos; i < len(g.order); i++ {
		if g.order[i] == l {
			g.pos = i + 1
			break
		}
	}
	var s *gatherSlot
	held := 0
	for _, x := range g.slots {
		if x.held {
			held++
		}
		if x.layer == l {
			s = x
		}
	}
	if s != nil && s.held {
		return nil // already begun
	}
	if s == nil {
		r.dropAhead(-1) // the pass went elsewhere
		if held >= plan.GatherSlots {
			return fmt.Errorf("zinf: begin layer %d: %d layers are begun and not ended (with Options.GatherLayers a rank holds the full parameters of at most %d): end one first", l, held, plan.GatherSlots)
		}
		var err error
		if s, err = r.startGather(ctx, l, false); err != nil {
			return err
		}
		g.slots = append(g.slots, s)
	}
	t0 := time.Now()
	err := s.job.wait(ctx)
	d := time.Since(t0)
	r.mu.Lock()
	r.ioWaitNs += int64(d)
	r.commStats.GatherWait += d
	if err == nil && s.ahead {
		r.commStats.GatheredAhead++
	}
	r.mu.Unlock()
	if err != nil {
		if ctx.Err() == nil {
			r.dropSlot(s)
		}
		return fmt.Errorf("zinf: begin layer %d: %w", l, err)
	}
	s.held = true
	// Gather the next layer of the pass while this one computes, when a
	// slot is free (after the last layer of a repeating pass, the next
	// pass's first: gatherPass keeps it). Whether it is depends only on
	// the loop's calls, the same on every rank, so every rank issues the
	// same collectives.
	next := -1
	switch {
	case g.pos < len(g.order):
		next = g.order[g.pos]
	case g.repeat && len(g.order) > 0:
		next = g.order[0]
	}
	if held == 0 && next >= 0 {
		taken := false
		for _, x := range g.slots {
			taken = taken || x.layer == next
		}
		if !taken {
			ahead, err := r.startGather(ctx, next, true)
			if err != nil {
				return err
			}
			g.slots = append(g.slots, ahead)
		}
	}
	return nil
}

// endGathered is EndLayer with GatherLayers: the layer's full parameters
// are freed.
func (r *Runtime) endGathered(l int) {
	for _, s := range r.gather.slots {
		if s.layer == l && s.held {
			r.dropSlot(s)
			return
		}
	}
}

// gatheredBytes returns the full bytes of a parameter of a begun layer.
func (r *Runtime) gatheredBytes(op, name string) ([]byte, error) {
	l := r.model.Layer[name]
	for _, s := range r.gather.slots {
		if s.layer != l || !s.held {
			continue
		}
		for i, n := range s.names {
			if n == name {
				if s.bufs[i] == nil {
					return nil, nil
				}
				return s.bufs[i].Bytes()[:int(r.model.Numel[name])*r.DType.Size()], nil
			}
		}
	}
	return nil, fmt.Errorf("zinf: %s %q: its layer %d is not begun (with Options.GatherLayers, BeginLayer gathers a layer's full parameters and EndLayer frees them)", op, name, l)
}

// readGathered is ReadParam and ReadParamBytes with GatherLayers: the
// full tensor.
func (r *Runtime) readGathered(name string, dtype tensor.DType, dst []byte, dst32 []float32) error {
	full, err := r.gatheredBytes("read", name)
	if err != nil {
		return err
	}
	switch {
	case dst32 != nil:
		buffers.Decode(r.DType, dst32, full)
	case dtype == r.DType:
		copy(dst, full)
	default:
		tmp := make([]float32, r.model.Numel[name])
		buffers.Decode(r.DType, tmp, full)
		buffers.Encode(dtype, dst, tmp)
	}
	return nil
}

// closeDist drops every gathered layer and stops the collective worker;
// it waits for a collective in flight (which ends with every rank, or
// with the world's failure: abort the Comm first when the loop failed).
func (r *Runtime) closeDist() {
	if r.cw == nil {
		return
	}
	for _, s := range slices.Clone(r.gather.slots) {
		r.dropSlot(s)
	}
	r.cw.stop()
	r.cw = nil
}

// drainComm waits for the collectives queued (the gather ahead) and
// drops the layers gathered ahead: before a step changes the
// parameters, and before anything else uses the Comm directly.
func (r *Runtime) drainComm() {
	if r.cw == nil {
		return
	}
	r.dropAhead(-1)
	j := r.cw.submit(func() error { return nil })
	<-j.done
}

// ReduceGrad hands this rank's own gradient of a parameter for one
// micro-step (local: the full tensor, from this rank's data) when the
// ranks are separate processes: the gradients of every rank are summed,
// in rank order (a reduce-scatter through Options.Comm: each rank
// receives the sum of its partition only), multiplied by scale (1/world
// size for the mean; 1 leaves the sum as it is), and accumulated into
// this rank's partition as AccumulateGrad does. Every rank calls it for
// the same parameters in the same order. The result equals, bit for
// bit, one process summing the ranks' gradients in rank order, then
// scaling.
//
// A call that fails in the gradient swapper (a full disk) adds nothing
// and may be retried: the reduced partition is kept, and the retry does
// not run the collective again. A failed collective fails the world.
func (r *Runtime) ReduceGrad(ctx context.Context, name string, local []float32, scale float32) error {
	if err := r.closedErr("reduce "+strconv.Quote(name), grad.ErrClosed); err != nil {
		return err
	}
	if err := r.settle(ctx); err != nil {
		return err
	}
	if r.comm == nil {
		return errors.New("zinf: ReduceGrad needs Options.Comm (this rank's comm.Comm); with the ranks' gradients already summed, use AccumulateGrad")
	}
	return r.ReduceGrads(ctx, name, [][]float32{local}, GradReduce{Scale: scale})
}

// GradReduce says how ReduceGrads combines the ranks' gradients.
type GradReduce struct {
	// Per is how many gradients each rank hands (the same slice on every
	// rank); nil: one each.
	Per []int
	// Scale multiplies the sum (1/data-parallel ranks for the mean); 0
	// and 1 leave it as it is.
	Scale float32
	// Round, when tensor.Float16 or tensor.BFloat16, rounds the scaled
	// sum to that dtype (and back to fp32), as gradients communicated in
	// half precision are. Default tensor.Float32: no rounding.
	Round tensor.DType
}

func (r *Runtime) onePerRank() []int {
	if len(r.ones) != r.World {
		r.ones = make([]int, r.World)
		for q := range r.ones {
			r.ones[q] = 1
		}
	}
	return r.ones
}

// ReduceGrads is ReduceGrad with more choices (GradReduce): a rank may
// stand in for several data-parallel ranks (a job resumed at a smaller
// world size that keeps its data-parallel degree, say): local holds this
// rank's gradients, one per data-parallel rank it computes, and how.Per[q]
// is how many rank q hands. The sum runs in the order of the ranks, then
// of local: with consecutive data-parallel ranks per process it equals
// one process per data-parallel rank, bit for bit. Then the scale, then
// the rounding.
func (r *Runtime) ReduceGrads(ctx context.Context, name string, local [][]float32, how GradReduce) error {
	if err := r.closedErr("reduce "+strconv.Quote(name), grad.ErrClosed); err != nil {
		return err
	}
	if err := r.settle(ctx); err != nil {
		return err
	}
	per, scale := how.Per, how.Scale
	if per == nil {
		per = r.onePerRank()
	}
	if scale == 0 {
		scale = 1
	}
	if how.Round != tensor.Float32 && how.Round != tensor.Float16 && how.Round != tensor.BFloat16 {
		return fmt.Errorf("zinf: reduce %q: GradReduce.Round %v: allowed float32 (none), float16, bfloat16", name, how.Round)
	}
	if r.inference {
		return errInference
	}
	if r.comm == nil {
		return errors.New("zinf: ReduceGrads needs Options.Comm (this rank's comm.Comm); with the ranks' gradients already summed, use AccumulateGrad")
	}
	numel, ok := r.model.Numel[name]
	if !ok {
		return fmt.Errorf("zinf: reduce %q: not a tensor of the model", name)
	}
	if len(per) != r.World || per[r.Rank] != len(local) {
		return fmt.Errorf("zinf: reduce %q: per = %v for a world of %d ranks, this rank (%d) handing %d gradients", name, per, r.World, r.Rank, len(local))
	}
	for i, g := range local {
		if int64(len(g)) != numel {
			return fmt.Errorf("zinf: reduce %q: gradient %d has %d elements, the tensor %d (hand the full tensor)", name, i, len(g), numel)
		}
	}
	part := []float32(nil)
	if p := r.reducePending; p != nil && p.name == name {
		part = p.part // a retry: the collective ran already
	} else {
		counts := r.counts(numel, 1)
		n := counts[r.Rank]
		if cap(r.reduceScratch) < n {
			r.reduceScratch = make([]float32, n)
		}
		part = r.reduceScratch[:n]
		t0 := time.Now()
		j := r.cw.submit(func() error { return r.comm.ReduceScatterMany(ctx, local, part, counts, per) })
		err := j.wait(ctx)
		if err != nil {
			if ctx.Err() != nil {
				<-j.done // the collective uses local and part until it ends
			}
			return fmt.Errorf("zinf: reduce %q: %w", name, err)
		}
		if scale != 1 {
			for i := range part {
				part[i] *= scale
			}
		}
		if how.Round != tensor.Float32 {
			buf := make([]byte, len(part)*how.Round.Size())
			buffers.Encode(how.Round, buf, part)
			buffers.Decode(how.Round, part, buf)
		}
		others := 0
		for q, p := range per {
			if q != r.Rank {
				others += p
			}
		}
		r.mu.Lock()
		r.commStats.ReduceScatters++
		r.commStats.ReduceScatterSent += int64(len(local)) * (numel - int64(n)) * 4
		r.commStats.ReduceScatterReceived += int64(others) * int64(n) * 4
		r.commStats.ReduceScatterTime += time.Since(t0)
		r.ioWaitNs += int64(time.Since(t0))
		r.mu.Unlock()
		r.reducePending = &pendingReduce{name: name, part: part}
	}
	t0 := time.Now()
	err := r.accumulate(ctx, name, part)
	r.mu.Lock()
	r.ioWaitNs += int64(time.Since(t0))
	r.mu.Unlock()
	if err != nil {
		return err
	}
	r.reducePending = nil
	return nil
}

// Collective runs f with this rank's Comm after the collectives the
// runtime queued (the gather ahead), so that a loop's own collectives
// (a loss all-reduce, say) keep one order with the runtime's on every
// rank. It fails without Options.Comm.
func (r *Runtime) Collective(ctx context.Context, f func(comm.Comm) error) error {
	if err := r.closedErr("collective", nil); err != nil {
		return err
	}
	if r.comm == nil {
		return errors.New("zinf: Collective needs Options.Comm")
	}
	j := r.cw.submit(func() error { return f(r.comm) })
	if err := j.wait(ctx); err != nil {
		if ctx.Err() != nil {
			<-j.done
		}
		return err
	}
	return nil
}

// Comm returns Options.Comm (nil without one).
func (r *Runtime) Comm() comm.Comm { return r.comm }

package policy

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"
)

// ErrNoFetcher: a Scheduler was built without a Fetcher.
var ErrNoFetcher = errors.New("policy: scheduler has no fetcher")

// Fetcher brings tensors in from where they are homed (the parameter
// swapper implements it over the NVMe store).
//
// Prefetch starts bringing the named tensors in and returns without
// waiting; a name already resident or in flight is not fetched twice. An
// error means the fetches may not have started; the scheduler then fetches
// the layer again on demand when it is used. Wait blocks until the named
// tensors are resident (or ctx is done, or a fetch failed) and returns the
// first error. Release says the caller is done with the tensors: their
// memory may be reused, and nothing is written back (parameters are
// read-only between optimizer steps). Releasing a tensor that is not
// resident does nothing.
type Fetcher interface {
	Prefetch(names ...string) error
	Wait(ctx context.Context, names ...string) error
	Release(names ...string)
}

// SchedulerOptions tunes a Scheduler.
type SchedulerOptions struct {
	// Depth is how many layers ahead, in the pass order, Begin prefetches;
	// in a repeating pass (StartRepeatingPass), a layer of under 1/16 of
	// the largest layer's bytes (a norm, a small head) is prefetched with
	// them and does not count.
	// Default (0): the placement's PrefetchDepth, or none without one.
	// Negative: none.
	Depth int
	// BudgetBytes bounds the bytes of tensors prefetched but not yet in use
	// (Begin not called for their layer). Default (0): the placement's
	// PrefetchBudgetBytes when it has parameter buffers, else no bound.
	// Negative: no bound.
	BudgetBytes int64
	// SizeOf returns a tensor's bytes. Default: the placement's SizeOf,
	// or 0 for every tensor without a placement.
	SizeOf func(name string) int64
}

// SchedStats counts what a Scheduler did.
type SchedStats struct {
	// Begins counts Begin calls; Hits those whose layer was prefetched;
	// DemandMisses those whose layer had to be fetched on demand.
	Begins, Hits, DemandMisses int64
	// Prefetches counts layers prefetched, PrefetchedBytes their bytes,
	// PrefetchErrors the Prefetch calls that failed.
	Prefetches, PrefetchedBytes, PrefetchErrors int64
	// PeakPrefetchedBytes is the most bytes prefetched but not yet in use
	// at any time; it never exceeds the budget.
	PeakPrefetchedBytes int64
	// Releases counts layers released by End.
	Releases int64
	// Waited is the time Begin spent bringing its layer in (the demand
	// fetch and the wait).
	Waited time.Duration
}

type layerState uint8

const (
	idle      layerState = iota // nothing requested
	requested                   // prefetched, not yet in use
	inUse                       // between Begin and End
)

// Scheduler walks a pass's order of layers: Begin makes a layer's tensors
// resident (a demand fetch if they were not prefetched) and prefetches the
// next layers of the pass within a byte budget, End releases the layer.
// A layer begun while another is still in use (a loop that begins the
// next layer under the last compute of this one) prefetches what follows
// it only when that other layer ends: the pool then holds two layers in
// use and the window, never two in use, the window and the next layer
// besides, which a pool sized for one layer in use sends back before use
// (read twice).
//
// One training loop drives a Scheduler; its methods may be called from
// several goroutines (Stats from a metrics loop, End from a release
// goroutine), and only Wait runs outside its lock.
type Scheduler struct {
	f          Fetcher
	layers     [][]string
	layerBytes []int64
	maxBytes   int64 // the largest layer's bytes
	depth      int
	budget     int64 // < 0: no bound

	mu     sync.Mutex
	state  []layerState
	order  []int
	pos    int   // next position of order Begin expects
	repeat bool  // the pass after this one visits order again
	unused int64 // bytes prefetched, not yet in use
	// deferred is the position of order whose window Begin left for
	// the next End to prefetch (another layer was in use), or -1.
	deferred int
	stats    SchedStats
}

// NewScheduler returns a Scheduler over layers (for each layer, the names
// of its tensors to fetch: Placement.NVMeParamsByLayer). p supplies the
// defaults of opts and may be nil. The pass order is forward (0..L-1) until
// StartPass says otherwise.
func NewScheduler(p *Placement, layers [][]string, f Fetcher, opts SchedulerOptions) *Scheduler {
	s := &Scheduler{f: f, depth: opts.Depth, budget: opts.BudgetBytes, deferred: -1}
	if s.depth == 0 && p != nil {
		s.depth = p.PrefetchDepth
	}
	s.depth = max(s.depth, 0)
	if s.budget == 0 {
		s.budget = -1
		if p != nil && p.ParamBufferCount > 0 {
			s.budget = p.PrefetchBudgetBytes
		}
	}
	sizeOf := opts.SizeOf
	if sizeOf == nil {
		sizeOf = func(string) int64 { return 0 }
		if p != nil {
			sizeOf = p.SizeOf
		}
	}
	s.layers = make([][]string, len(layers))
	s.layerBytes = make([]int64, len(layers))
	for l, names := range layers {
		s.layers[l] = append([]string(nil), names...)
		for _, n := range names {
			s.layerBytes[l] += sizeOf(n)
		}
		s.maxBytes = max(s.maxBytes, s.layerBytes[l])
		// Smallest first: a small tensor (a bias, a norm) queued behind
		// its layer's large one completes only after it — and, as the
		// loop begins the layer and with it the next layer's fetch, often
		// only after that one too, which the layer then waits for.
		slices.SortStableFunc(s.layers[l], func(a, b string) int { return cmp.Compare(sizeOf(a), sizeOf(b)) })
	}
	s.state = make([]layerState, len(layers))
	s.order = make([]int, len(layers))
	for i := range s.order {
		s.order[i] = i
	}
	return s
}

// StartPass sets the sequence of layers the next Begin calls visit
// (forward 0..L-1, backward L-1..0); layers out of range are dropped.
// Layers prefetched and not used are kept when the new pass uses them
// within its first Depth positions (small layers take none, see
// smallShare), else released. Prefetching stops at
// the pass's last layer (see StartRepeatingPass).
func (s *Scheduler) StartPass(order []int) { s.startPass(order, false) }

// StartRepeatingPass is StartPass for a pass that the next pass repeats
// (inference: every decoding step is the same forward pass). Prefetching
// then runs on past the pass's end into the next pass's first layers,
// within the same Depth and byte budget: near the end of the pass, the
// window of Depth positions ahead wraps around to the order's start. A
// layer still ahead in this pass is never taken for the next one, and
// the layers ahead in this pass come first (prefetching stops at the
// first layer over the budget), so the next pass's layers never compete
// with this pass's. The next StartPass or StartRepeatingPass keeps them
// when its order begins with them (they lie within its first Depth
// positions), and releases them otherwise; so does ReleasePrefetched.
func (s *Scheduler) StartRepeatingPass(order []int) { s.startPass(order, true) }

func (s *Scheduler) startPass(order []int, repeat bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.order = s.order[:0]
	for _, l := range order {
		if l >= 0 && l < len(s.layers) {
			s.order = append(s.order, l)
		}
	}
	s.pos = 0
	s.deferred = -1
	// The layers to keep are counted the way the window that prefetched
	// them counted (small layers free after a repeating pass).
	free := s.repeat || repeat
	s.repeat = repeat
	keep := map[int]bool{}
	for i, n := 0, 0; i < len(s.order) && n < s.depth; i++ {
		keep[s.order[i]] = true
		if !s.small(s.order[i], free) {
			n++
		}
	}
	for l, st := range s.state {
		if st == requested && !keep[l] {
			s.drop(l)
		}
	}
}

// ReleasePrefetched releases every layer prefetched and not in use: for a
// loop whose passes end (the last pass of a StartRepeatingPass loop
// prefetched the first layers of a pass that does not come). Layers in
// use stay until End.
func (s *Scheduler) ReleasePrefetched() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for l, st := range s.state {
		if st == requested {
			s.drop(l)
		}
	}
}

// smallShare: in a repeating pass, a layer of under 1/smallShare of the
// largest layer's bytes (a final norm and a small head, a small
// embedding) is small: it is prefetched with the window but takes none of
// its Depth positions, so that it does not keep the next pass's first
// large layer out of the wrap-around. Other passes count every layer as
// before (with small layers free, a training pass's window changed with
// the timing of its prefetches: TestLayerMajorEqualsMicroBatchMajor in
// contrib/gomlx read a small layer twice in some runs under -race).
const smallShare = 16

// small reports whether layer l takes no depth position: small layers
// are free (a repeating pass) and l is small (see smallShare).
func (s *Scheduler) small(l int, free bool) bool {
	return free && s.layerBytes[l]*smallShare < s.maxBytes
}

// window returns the layers of the Depth positions after pos in the pass,
// in order (small layers take no position): for a repeating pass, the
// positions past its end are the next pass's, from its start, up to (not
// including) the layer at pos again, less any layer that comes again
// later in this pass. s.mu is held.
func (s *Scheduler) window(pos int) []int {
	n := len(s.order)
	var w []int
	for i, taken := pos+1, 0; taken < s.depth; i++ {
		var l int
		switch {
		case i < n:
			l = s.order[i]
		case !s.repeat || i-n >= pos:
			return w
		default:
			l = s.order[i-n]
			if slices.Contains(s.order[pos+1:], l) {
				continue
			}
		}
		w = append(w, l)
		if !s.small(l, s.repeat) {
			taken++
		}
	}
	return w
}

// drop releases a prefetched, unused layer. s.mu is held.
func (s *Scheduler) drop(l int) {
	s.unused -= s.layerBytes[l]
	s.state[l] = idle
	if len(s.layers[l]) > 0 && s.f != nil {
		s.f.Release(s.layers[l]...)
	}
}

// Begin returns once the layer's tensors are resident: the barrier before
// the layer computes. A layer that was not prefetched is a demand miss: it
// is fetched first, ahead of any prefetch Begin issues. Then Begin
// prefetches the layers of the next Depth positions of the pass order, as
// long as the bytes prefetched but not yet in use stay within the budget,
// and waits for this layer's tensors only. On an error the layer's tensors
// are released and the layer is not in use.
func (s *Scheduler) Begin(ctx context.Context, layer int) error {
	if s.f == nil {
		return ErrNoFetcher
	}
	if layer < 0 || layer >= len(s.layers) {
		return fmt.Errorf("%w: scheduler: layer %d out of range 0..%d", ErrInvalid, layer, len(s.layers)-1)
	}
	start := time.Now()
	s.mu.Lock()
	s.stats.Begins++
	pos := -1
	for i := s.pos; i < len(s.order); i++ {
		if s.order[i] == layer {
			pos = i
			break
		}
	}
	if pos >= 0 {
		// Layers skipped over will not be used in this pass unless they
		// come again within the window.
		window := map[int]bool{}
		for _, l := range s.window(pos) {
			window[l] = true
		}
		for i := s.pos; i < pos; i++ {
			if l := s.order[i]; s.state[l] == requested && !window[l] && l != layer {
				s.drop(l)
			}
		}
		s.pos = pos + 1
	}
	names := s.layers[layer]
	switch s.state[layer] {
	case requested:
		s.unused -= s.layerBytes[layer]
		s.stats.Hits++
	case idle:
		if len(names) > 0 {
			s.stats.DemandMisses++
			if err := s.f.Prefetch(names...); err != nil {
				s.mu.Unlock()
				return fmt.Errorf("policy: layer %d: demand fetch: %w", layer, err)
			}
		}
	}
	s.state[layer] = inUse
	if pos >= 0 {
		if s.inUseExcept(layer) {
			s.deferred = max(s.deferred, pos)
		} else {
			s.prefetchAfter(pos)
		}
	}
	s.mu.Unlock()

	var err error
	if len(names) > 0 {
		err = s.f.Wait(ctx, names...)
	}
	s.mu.Lock()
	s.stats.Waited += time.Since(start)
	if err != nil {
		s.state[layer] = idle
		s.f.Release(names...)
	}
	s.mu.Unlock()
	if err != nil {
		return fmt.Errorf("policy: layer %d: %w", layer, err)
	}
	return nil
}

// prefetchAfter prefetches the layers at positions pos+1..pos+depth in
// order (see window), stopping at the first that would exceed the budget.
// s.mu is held.
func (s *Scheduler) prefetchAfter(pos int) {
	for _, l := range s.window(pos) {
		if s.state[l] != idle || len(s.layers[l]) == 0 {
			continue
		}
		b := s.layerBytes[l]
		if s.budget >= 0 && s.unused+b > s.budget {
			return
		}
		if err := s.f.Prefetch(s.layers[l]...); err != nil {
			s.stats.PrefetchErrors++
			return
		}
		s.state[l] = requested
		s.unused += b
		s.stats.Prefetches++
		s.stats.PrefetchedBytes += b
		s.stats.PeakPrefetchedBytes = max(s.stats.PeakPrefetchedBytes, s.unused)
	}
}

// End releases the layer's tensors after use. A layer not in use (no
// Begin, or a failed one) is left alone.
func (s *Scheduler) End(layer int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if layer < 0 || layer >= len(s.layers) || s.state[layer] != inUse {
		return
	}
	s.state[layer] = idle
	s.stats.Releases++
	if len(s.layers[layer]) > 0 && s.f != nil {
		s.f.Release(s.layers[layer]...)
	}
	if p := s.deferred; p >= 0 {
		s.deferred = -1
		s.prefetchAfter(p)
	}
}

// inUseExcept reports whether a layer other than l is in use (begun and
// not ended). Called with s.mu held.
func (s *Scheduler) inUseExcept(l int) bool {
	for i, st := range s.state {
		if st == inUse && i != l {
			return true
		}
	}
	return false
}

// Reset releases every layer prefetched or in use and rewinds the pass:
// for an aborted step.
func (s *Scheduler) Reset() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for l, st := range s.state {
		if st != idle && s.f != nil && len(s.layers[l]) > 0 {
			s.f.Release(s.layers[l]...)
		}
		s.state[l] = idle
	}
	s.unused = 0
	s.pos = 0
	s.deferred = -1
}

// Stats returns what the scheduler did so far.
func (s *Scheduler) Stats() SchedStats {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.stats
}

package policy

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
)

// fakeFetcher records every call and keeps what is resident; it never
// blocks. failPrefetch / failWait make the named tensor's calls fail.
type fakeFetcher struct {
	mu           sync.Mutex
	calls        []string
	inFlight     map[string]bool // prefetched, not released
	failPrefetch map[string]error
	failWait     map[string]error
}

func newFake() *fakeFetcher {
	return &fakeFetcher{inFlight: map[string]bool{}, failPrefetch: map[string]error{}, failWait: map[string]error{}}
}

func (f *fakeFetcher) Prefetch(names ...string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, "prefetch "+strings.Join(names, ","))
	for _, n := range names {
		if err := f.failPrefetch[n]; err != nil {
			return err
		}
	}
	for _, n := range names {
		f.inFlight[n] = true
	}
	return nil
}

func (f *fakeFetcher) Wait(ctx context.Context, names ...string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, "wait "+strings.Join(names, ","))
	for _, n := range names {
		if err := f.failWait[n]; err != nil {
			return err
		}
		if !f.inFlight[n] {
			return fmt.Errorf("wait for %s, never prefetched", n)
		}
	}
	return ctx.Err()
}

func (f *fakeFetcher) Release(names ...string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, "release "+strings.Join(names, ","))
	for _, n := range names {
		delete(f.inFlight, n)
	}
}

func (f *fakeFetcher) take() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	c := f.calls
	f.calls = nil
	return c
}

// testLayers returns L layers of two tensors each, "wL" and "bL" (in that
// order: the scheduler fetches the smaller bias first).
func testLayers(L int) [][]string {
	out := make([][]string, L)
	for l := range out {
		out[l] = []string{fmt.Sprintf("w%d", l), fmt.Sprintf("b%d", l)}
	}
	return out
}

// size: weights 100 bytes, biases 1.
func size(name string) int64 {
	if strings.HasPrefix(name, "w") {
		return 100
	}
	return 1
}

func forward(L int) []int {
	o := make([]int, L)
	for i := range o {
		o[i] = i
	}
	return o
}

func backward(L int) []int {
	o := make([]int, L)
	for i := range o {
		o[i] = L - 1 - i
	}
	return o
}

func wantCalls(t *testing.T, got []string, want ...string) {
	t.Helper()
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("calls:\n  %s\nwant:\n  %s", strings.Join(got, "\n  "), strings.Join(want, "\n  "))
	}
}

func TestSchedulerDepthAndRelease(t *testing.T) {
	f := newFake()
	s := NewScheduler(nil, testLayers(5), f, SchedulerOptions{Depth: 2, SizeOf: size})
	ctx := context.Background()
	s.StartPass(forward(5))

	if err := s.Begin(ctx, 0); err != nil {
		t.Fatal(err)
	}
	// Layer 0 was never prefetched: a demand miss, fetched before layers
	// 1 and 2 are prefetched, and Wait is for its own tensors only.
	wantCalls(t, f.take(), "prefetch b0,w0", "prefetch b1,w1", "prefetch b2,w2", "wait b0,w0")
	s.End(0)
	wantCalls(t, f.take(), "release b0,w0")

	if err := s.Begin(ctx, 1); err != nil {
		t.Fatal(err)
	}
	wantCalls(t, f.take(), "prefetch b3,w3", "wait b1,w1")
	s.End(1)
	f.take()
	for l := 2; l < 5; l++ {
		if err := s.Begin(ctx, l); err != nil {
			t.Fatal(err)
		}
		s.End(l)
	}
	wantCalls(t, f.take(),
		"prefetch b4,w4", "wait b2,w2", "release b2,w2",
		"wait b3,w3", "release b3,w3",
		"wait b4,w4", "release b4,w4")
	st := s.Stats()
	if st.DemandMisses != 1 || st.Hits != 4 || st.Prefetches != 4 || st.Releases != 5 || st.Begins != 5 {
		t.Errorf("stats %+v", st)
	}
	if st.PeakPrefetchedBytes != 202 {
		t.Errorf("peak prefetched %d, want 202 (two layers)", st.PeakPrefetchedBytes)
	}
	if len(f.inFlight) != 0 {
		t.Errorf("still held after the pass: %v", f.inFlight)
	}
}

func TestSchedulerBudget(t *testing.T) {
	f := newFake()
	// Depth 3 but a budget of 250 bytes: two layers (202) fit, three (303) do not.
	s := NewScheduler(nil, testLayers(6), f, SchedulerOptions{Depth: 3, BudgetBytes: 250, SizeOf: size})
	ctx := context.Background()
	if err := s.Begin(ctx, 0); err != nil {
		t.Fatal(err)
	}
	wantCalls(t, f.take(), "prefetch b0,w0", "prefetch b1,w1", "prefetch b2,w2", "wait b0,w0")
	s.End(0)
	if err := s.Begin(ctx, 1); err != nil {
		t.Fatal(err)
	}
	// Layer 1 is in use now: 101 bytes prefetched, room for one more.
	wantCalls(t, f.take(), "release b0,w0", "prefetch b3,w3", "wait b1,w1")
	s.End(1)
	for l := 2; l < 6; l++ {
		if err := s.Begin(ctx, l); err != nil {
			t.Fatal(err)
		}
		s.End(l)
	}
	if st := s.Stats(); st.PeakPrefetchedBytes > 250 || st.DemandMisses != 1 {
		t.Errorf("stats %+v: peak over the 250-byte budget or extra misses", st)
	}
}

func TestSchedulerBudgetBelowOneLayer(t *testing.T) {
	f := newFake()
	s := NewScheduler(nil, testLayers(3), f, SchedulerOptions{Depth: 2, BudgetBytes: 50, SizeOf: size})
	ctx := context.Background()
	for _, l := range forward(3) {
		if err := s.Begin(ctx, l); err != nil {
			t.Fatal(err)
		}
		s.End(l)
	}
	st := s.Stats()
	if st.Prefetches != 0 || st.DemandMisses != 3 || st.PeakPrefetchedBytes != 0 {
		t.Errorf("a layer larger than the budget was prefetched: %+v", st)
	}
}

// A skipped-ahead Begin is a demand miss that goes before the prefetches
// it triggers, even when earlier prefetches are outstanding.
func TestSchedulerDemandMissFirst(t *testing.T) {
	f := newFake()
	s := NewScheduler(nil, testLayers(8), f, SchedulerOptions{Depth: 1, SizeOf: size})
	ctx := context.Background()
	if err := s.Begin(ctx, 0); err != nil {
		t.Fatal(err)
	}
	s.End(0)
	f.take()
	// The loop jumps to layer 4: layer 1 (prefetched) is skipped and
	// released, layer 4 is fetched on demand, then layer 5 prefetched.
	if err := s.Begin(ctx, 4); err != nil {
		t.Fatal(err)
	}
	wantCalls(t, f.take(), "release b1,w1", "prefetch b4,w4", "prefetch b5,w5", "wait b4,w4")
	if st := s.Stats(); st.DemandMisses != 2 || st.Hits != 0 {
		t.Errorf("stats %+v", st)
	}
	s.End(4)
	if err := s.Begin(ctx, 5); err != nil {
		t.Fatal(err)
	}
	wantCalls(t, f.take(), "release b4,w4", "prefetch b6,w6", "wait b5,w5")
}

func TestSchedulerBackwardPass(t *testing.T) {
	f := newFake()
	s := NewScheduler(nil, testLayers(4), f, SchedulerOptions{Depth: 1, SizeOf: size})
	ctx := context.Background()
	s.StartPass(forward(4))
	for _, l := range forward(4) {
		if err := s.Begin(ctx, l); err != nil {
			t.Fatal(err)
		}
		s.End(l)
	}
	f.take()
	s.StartPass(backward(4))
	if err := s.Begin(ctx, 3); err != nil {
		t.Fatal(err)
	}
	wantCalls(t, f.take(), "prefetch b3,w3", "prefetch b2,w2", "wait b3,w3")
	s.End(3)
	if err := s.Begin(ctx, 2); err != nil {
		t.Fatal(err)
	}
	wantCalls(t, f.take(), "release b3,w3", "prefetch b1,w1", "wait b2,w2")
}

func TestSchedulerStartPassReleasesUnused(t *testing.T) {
	f := newFake()
	s := NewScheduler(nil, testLayers(6), f, SchedulerOptions{Depth: 2, SizeOf: size})
	ctx := context.Background()
	if err := s.Begin(ctx, 0); err != nil { // prefetches 1 and 2
		t.Fatal(err)
	}
	s.End(0)
	f.take()
	// An aborted pass: the next one starts at 5 and uses 4 and 3 first,
	// so the prefetched 1 and 2 are released.
	s.StartPass(backward(6))
	calls := f.take()
	wantCalls(t, calls, "release b1,w1", "release b2,w2")
	// A pass that starts with a prefetched layer keeps it.
	if err := s.Begin(ctx, 5); err != nil {
		t.Fatal(err)
	}
	s.End(5)
	f.take()
	s.StartPass([]int{4, 3, 99, -1})
	wantCalls(t, f.take())
	if err := s.Begin(ctx, 4); err != nil {
		t.Fatal(err)
	}
	wantCalls(t, f.take(), "wait b4,w4")
	s.Reset()
	if len(f.inFlight) != 0 {
		t.Errorf("Reset left %v held", f.inFlight)
	}
}

func TestSchedulerErrors(t *testing.T) {
	ctx := context.Background()
	boom := errors.New("boom")

	f := newFake()
	f.failWait["w1"] = boom
	s := NewScheduler(nil, testLayers(3), f, SchedulerOptions{Depth: 1, SizeOf: size})
	if err := s.Begin(ctx, 0); err != nil {
		t.Fatal(err)
	}
	s.End(0)
	f.take()
	err := s.Begin(ctx, 1)
	if !errors.Is(err, boom) || !strings.Contains(err.Error(), "layer 1") {
		t.Fatalf("Begin = %v, want boom naming layer 1", err)
	}
	// The failed layer's tensors are released and End does nothing.
	wantCalls(t, f.take(), "prefetch b2,w2", "wait b1,w1", "release b1,w1")
	s.End(1)
	wantCalls(t, f.take())

	// A failed prefetch is retried on demand, where its error surfaces.
	f = newFake()
	f.failPrefetch["w1"] = boom
	s = NewScheduler(nil, testLayers(3), f, SchedulerOptions{Depth: 1, SizeOf: size})
	if err := s.Begin(ctx, 0); err != nil {
		t.Fatalf("a prefetch error failed the current layer: %v", err)
	}
	if st := s.Stats(); st.PrefetchErrors != 1 {
		t.Errorf("stats %+v", st)
	}
	s.End(0)
	if err := s.Begin(ctx, 1); !errors.Is(err, boom) {
		t.Fatalf("Begin = %v, want the demand fetch's error", err)
	}

	// Bad layers, no fetcher, a cancelled context.
	if err := s.Begin(ctx, 3); !errors.Is(err, ErrInvalid) {
		t.Errorf("Begin(3) = %v, want ErrInvalid", err)
	}
	if err := NewScheduler(nil, testLayers(1), nil, SchedulerOptions{}).Begin(ctx, 0); !errors.Is(err, ErrNoFetcher) {
		t.Errorf("nil fetcher: %v", err)
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	f = newFake()
	s = NewScheduler(nil, testLayers(2), f, SchedulerOptions{})
	if err := s.Begin(cctx, 0); !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled: %v", err)
	}
	s.End(7) // out of range: ignored
}

// A layer with no NVMe tensors costs nothing: no calls, no miss.
func TestSchedulerEmptyLayers(t *testing.T) {
	f := newFake()
	layers := [][]string{{"w0"}, nil, {"w2"}}
	s := NewScheduler(nil, layers, f, SchedulerOptions{Depth: 1})
	ctx := context.Background()
	for l := range layers {
		if err := s.Begin(ctx, l); err != nil {
			t.Fatal(err)
		}
		s.End(l)
	}
	wantCalls(t, f.take(), "prefetch w0", "wait w0", "release w0", "prefetch w2", "wait w2", "release w2")
	if st := s.Stats(); st.DemandMisses != 1 || st.Hits != 1 {
		t.Errorf("stats %+v", st)
	}
}

// The defaults come from the placement: its depth, its budget, its sizes.
func TestSchedulerFromPlacement(t *testing.T) {
	spec := ModelSpec{Layers: 6, Width: 64, DType: 0, Batch: 1, World: 1}
	inv := spec.Inventory(0, 1)
	p, err := Plan(Tiers{GPUBytes: 1 << 30, CPUBytes: 1 << 30, NVMeReadBps: 1e6, NVMeWriteBps: 1e6},
		inv, Hints{ParamDevice: "nvme", OptimizerDevice: "cpu", PrefetchDepth: 2, ComputeSecondsPerLayer: 0.01})
	if err != nil {
		t.Fatal(err)
	}
	layers := p.NVMeParamsByLayer()
	if len(layers) != 6 || strings.Join(layers[2], ",") != "layer002.weight,layer002.bias" {
		t.Fatalf("NVMe params by layer: %v", layers)
	}
	f := newFake()
	s := NewScheduler(p, layers, f, SchedulerOptions{})
	ctx := context.Background()
	for _, pass := range [][]int{forward(6), backward(6)} {
		s.StartPass(pass)
		for _, l := range pass {
			if err := s.Begin(ctx, l); err != nil {
				t.Fatal(err)
			}
			s.End(l)
		}
	}
	st := s.Stats()
	if st.DemandMisses != 2 || st.Hits != 10 || st.PeakPrefetchedBytes > p.PrefetchBudgetBytes {
		t.Errorf("stats %+v, budget %d", st, p.PrefetchBudgetBytes)
	}
	if want := 2 * (p.SizeOf("layer000.weight") + p.SizeOf("layer000.bias")); st.PeakPrefetchedBytes != want {
		t.Errorf("peak %d, want two layers (%d)", st.PeakPrefetchedBytes, want)
	}
}

// Stats and End may run beside Begin.
func TestSchedulerConcurrentStats(t *testing.T) {
	f := newFake()
	s := NewScheduler(nil, testLayers(50), f, SchedulerOptions{Depth: 3, SizeOf: size})
	ctx := context.Background()
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := 0; i < 200; i++ {
			_ = s.Stats()
		}
	}()
	for l := 0; l < 50; l++ {
		if err := s.Begin(ctx, l); err != nil {
			t.Fatal(err)
		}
		go s.End(l)
	}
	<-done
}

// A layer's tensors are fetched smallest first, ties in the layer's order:
// a norm or a bias queued behind the layer's large weight would complete
// only after it (and after the next layer's weight, fetched when the loop
// begins this layer).
func TestSchedulerSmallestFirst(t *testing.T) {
	f := newFake()
	sizes := map[string]int64{"big": 1 << 20, "mid": 4096, "small": 8, "mid2": 4096, "next": 1 << 20, "nextb": 8}
	layers := [][]string{{"big", "mid", "small", "mid2"}, {"next", "nextb"}}
	s := NewScheduler(nil, layers, f, SchedulerOptions{Depth: 1, SizeOf: func(n string) int64 { return sizes[n] }})
	if err := s.Begin(context.Background(), 0); err != nil {
		t.Fatal(err)
	}
	wantCalls(t, f.take(), "prefetch small,mid,mid2,big", "prefetch nextb,next", "wait small,mid,mid2,big")
	if got := layers[0][0]; got != "big" {
		t.Errorf("the caller's layer list was reordered: %v", layers[0])
	}
}

// TestSchedulerOverlappedBegins: a backward pass that begins the next
// layer before it ends the one computing (the GoMLX loop's order) has the
// window after the new layer prefetched only when the old one ends, so
// the pool never holds two layers in use and the window besides; the
// layers then come in as prefetch hits, none fetched twice.
func TestSchedulerOverlappedBegins(t *testing.T) {
	f := newFake()
	s := NewScheduler(nil, testLayers(4), f, SchedulerOptions{Depth: 1, SizeOf: size})
	ctx := context.Background()
	s.StartPass(backward(4))
	if err := s.Begin(ctx, 3); err != nil {
		t.Fatal(err)
	}
	wantCalls(t, f.take(), "prefetch b3,w3", "prefetch b2,w2", "wait b3,w3")
	// Layer 2 begun while 3 is in use: no prefetch of layer 1 yet.
	if err := s.Begin(ctx, 2); err != nil {
		t.Fatal(err)
	}
	wantCalls(t, f.take(), "wait b2,w2")
	s.End(3)
	wantCalls(t, f.take(), "release b3,w3", "prefetch b1,w1")
	if err := s.Begin(ctx, 1); err != nil {
		t.Fatal(err)
	}
	wantCalls(t, f.take(), "wait b1,w1")
	s.End(2)
	wantCalls(t, f.take(), "release b2,w2", "prefetch b0,w0")
	if err := s.Begin(ctx, 0); err != nil {
		t.Fatal(err)
	}
	s.End(1)
	s.End(0)
	wantCalls(t, f.take(), "wait b0,w0", "release b1,w1", "release b0,w0")
	if st := s.Stats(); st.DemandMisses != 1 || st.Hits != 3 || st.Prefetches != 3 {
		t.Errorf("stats %+v: want 1 demand miss (the first layer), 3 hits, 3 prefetches", st)
	}
	// A layer begun alone prefetches at once, as before.
	s.StartPass(forward(4))
	f.take()
	if err := s.Begin(ctx, 0); err != nil {
		t.Fatal(err)
	}
	wantCalls(t, f.take(), "prefetch b0,w0", "prefetch b1,w1", "wait b0,w0")
}

package policy_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/zinfio/zinf/policy"
)

// recFetcher is a Fetcher that never blocks: it records each Prefetch
// and Release (by layer: "w3,b3" is layer 3) and what is fetched and not
// released.
type recFetcher struct {
	mu       sync.Mutex
	calls    []string
	resident map[string]bool
}

func newRec() *recFetcher { return &recFetcher{resident: map[string]bool{}} }

func (f *recFetcher) Prefetch(names ...string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, "prefetch "+strings.Join(names, ","))
	for _, n := range names {
		f.resident[n] = true
	}
	return nil
}

func (f *recFetcher) Wait(ctx context.Context, names ...string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, n := range names {
		if !f.resident[n] {
			return fmt.Errorf("wait for %s, never fetched", n)
		}
	}
	return ctx.Err()
}

func (f *recFetcher) Release(names ...string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, "release "+strings.Join(names, ","))
	for _, n := range names {
		delete(f.resident, n)
	}
}

// take returns the calls since the last take.
func (f *recFetcher) take() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	c := f.calls
	f.calls = nil
	return c
}

// held returns the tensors fetched and not released, sorted.
func (f *recFetcher) held() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var h []string
	for n := range f.resident {
		h = append(h, n)
	}
	slices.Sort(h)
	return h
}

// layersOf returns n layers of two 100-byte tensors, "wL" and "bL".
func layersOf(n int) [][]string {
	out := make([][]string, n)
	for l := range out {
		out[l] = []string{fmt.Sprintf("w%d", l), fmt.Sprintf("b%d", l)}
	}
	return out
}

func forward(n int) []int {
	o := make([]int, n)
	for i := range o {
		o[i] = i
	}
	return o
}

// visit begins and ends each layer of order (under a watchdog: a Begin
// that does not return fails the test) and returns, per layer, the calls
// the fetcher saw from its Begin to its End.
func visit(t *testing.T, s *policy.Scheduler, f *recFetcher, order []int) [][]string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var calls [][]string
	for _, l := range order {
		done := make(chan error, 1)
		go func() { done <- s.Begin(ctx, l) }()
		select {
		case err := <-done:
			if err != nil {
				t.Fatalf("begin %d: %v", l, err)
			}
		case <-time.After(30 * time.Second):
			t.Fatalf("begin %d did not return in 30 s", l)
		}
		s.End(l)
		calls = append(calls, f.take())
	}
	return calls
}

// TestRepeatingPassPrefetchesNextPass: a repeating pass's last layers
// prefetch the next pass's first ones (depth 2: layer 3 prefetches 4 and
// then 0, layer 4 prefetches 1), after every layer of the pass itself;
// the next pass keeps them and counts them as hits, so only the first
// pass has a demand miss. ReleasePrefetched then gives back what the last
// pass fetched for a pass that does not come.
func TestRepeatingPassPrefetchesNextPass(t *testing.T) {
	f := newRec()
	s := policy.NewScheduler(nil, layersOf(5), f, policy.SchedulerOptions{Depth: 2, BudgetBytes: -1, SizeOf: func(string) int64 { return 100 }})
	s.StartRepeatingPass(forward(5))
	calls := visit(t, s, f, forward(5))
	want := [][]string{
		{"prefetch w0,b0", "prefetch w1,b1", "prefetch w2,b2", "release w0,b0"},
		{"prefetch w3,b3", "release w1,b1"},
		{"prefetch w4,b4", "release w2,b2"},
		{"prefetch w0,b0", "release w3,b3"}, // wraps: layer 4 was prefetched at layer 2
		{"prefetch w1,b1", "release w4,b4"},
	}
	if !slices.EqualFunc(calls, want, slices.Equal) {
		t.Fatalf("first pass:\n got %q\nwant %q", calls, want)
	}
	if st := s.Stats(); st.DemandMisses != 1 || st.Hits != 4 {
		t.Fatalf("first pass: %d demand misses, %d hits, want 1 and 4", st.DemandMisses, st.Hits)
	}
	if h := f.held(); !slices.Equal(h, []string{"b0", "b1", "w0", "w1"}) {
		t.Fatalf("held between passes: %q, want layers 0 and 1", h)
	}
	for pass := 1; pass < 4; pass++ {
		s.StartRepeatingPass(forward(5))
		calls := visit(t, s, f, forward(5))
		if !slices.Equal(calls[0], []string{"prefetch w2,b2", "release w0,b0"}) {
			t.Fatalf("pass %d, layer 0: %q: layer 0 was fetched again or released early", pass, calls[0])
		}
	}
	st := s.Stats()
	if st.DemandMisses != 1 || st.Hits != 19 || st.Begins != 20 {
		t.Fatalf("4 passes: %d begins, %d demand misses, %d hits; want 20, 1, 19", st.Begins, st.DemandMisses, st.Hits)
	}
	if st.PeakPrefetchedBytes != 400 {
		t.Fatalf("peak prefetched %d bytes, want 400 (two layers)", st.PeakPrefetchedBytes)
	}
	s.ReleasePrefetched()
	if h := f.held(); len(h) != 0 {
		t.Fatalf("after ReleasePrefetched the fetcher holds %q", h)
	}
	// The next pass starts from nothing again.
	s.StartRepeatingPass(forward(5))
	visit(t, s, f, forward(5))
	if st := s.Stats(); st.DemandMisses != 2 {
		t.Fatalf("a pass after ReleasePrefetched: %d demand misses in all, want 2", st.DemandMisses)
	}
	s.Reset()
	if h := f.held(); len(h) != 0 {
		t.Fatalf("after Reset the fetcher holds %q", h)
	}
}

// TestRepeatingPassWithinBudget: the wrap-around takes no more than the
// byte budget, and the pass's own layers come first: with room for one
// layer prefetched and unused, layer 3 prefetches layer 4 only (layer 0
// of the next pass would exceed the budget), and layer 4 then prefetches
// layer 0. The next pass still begins on a hit.
func TestRepeatingPassWithinBudget(t *testing.T) {
	f := newRec()
	s := policy.NewScheduler(nil, layersOf(5), f, policy.SchedulerOptions{Depth: 3, BudgetBytes: 200, SizeOf: func(string) int64 { return 100 }})
	for pass := range 3 {
		s.StartRepeatingPass(forward(5))
		calls := visit(t, s, f, forward(5))
		if !slices.Equal(calls[3], []string{"prefetch w4,b4", "release w3,b3"}) {
			t.Fatalf("pass %d, layer 3: %q, want layer 4 alone prefetched", pass, calls[3])
		}
		if !slices.Equal(calls[4], []string{"prefetch w0,b0", "release w4,b4"}) {
			t.Fatalf("pass %d, layer 4: %q, want the next pass's layer 0 prefetched", pass, calls[4])
		}
	}
	st := s.Stats()
	if st.PeakPrefetchedBytes > 200 {
		t.Fatalf("peak prefetched %d bytes, over the budget of 200", st.PeakPrefetchedBytes)
	}
	if st.DemandMisses != 1 {
		t.Fatalf("3 passes: %d demand misses, want 1 (the first pass's layer 0)", st.DemandMisses)
	}
}

// TestRepeatingPassDepthBeyondPass: a depth longer than the pass never
// takes a layer of this pass that is in use or still ahead for the next
// one: after the first pass each layer is fetched once per pass, and all
// are hits.
func TestRepeatingPassDepthBeyondPass(t *testing.T) {
	f := newRec()
	s := policy.NewScheduler(nil, layersOf(3), f, policy.SchedulerOptions{Depth: 8, BudgetBytes: -1, SizeOf: func(string) int64 { return 100 }})
	for pass := range 3 {
		s.StartRepeatingPass(forward(3))
		calls := visit(t, s, f, forward(3))
		fetched := map[string]int{}
		for _, c := range slices.Concat(calls...) {
			if strings.HasPrefix(c, "prefetch ") {
				fetched[c]++
			}
		}
		for c, n := range fetched {
			if pass > 0 && n > 1 {
				t.Fatalf("pass %d: %q %d times: %q", pass, c, n, calls)
			}
		}
		if pass > 0 && len(fetched) != 3 {
			t.Fatalf("pass %d: prefetched %v, want each of the 3 layers once (for this pass or the next)", pass, fetched)
		}
	}
	if st := s.Stats(); st.DemandMisses != 1 || st.Hits != 8 {
		t.Fatalf("%d demand misses, %d hits; want 1 and 8", st.DemandMisses, st.Hits)
	}
}

// TestForwardThenBackwardDoesNotWrap: a plain pass (a training step's
// forward, then backward) prefetches nothing past its last layer, so the
// backward pass's first layer is fetched on demand, and a repeating pass
// followed by another order releases what it fetched for the pass that
// did not come.
func TestForwardThenBackwardDoesNotWrap(t *testing.T) {
	f := newRec()
	s := policy.NewScheduler(nil, layersOf(4), f, policy.SchedulerOptions{Depth: 2, BudgetBytes: -1, SizeOf: func(string) int64 { return 100 }})
	backward := []int{3, 2, 1, 0}
	s.StartPass(forward(4))
	calls := visit(t, s, f, forward(4))
	if !slices.Equal(calls[3], []string{"release w3,b3"}) {
		t.Fatalf("forward's last layer: %q, want nothing prefetched", calls[3])
	}
	if h := f.held(); len(h) != 0 {
		t.Fatalf("after a forward pass the fetcher holds %q", h)
	}
	s.StartPass(backward)
	visit(t, s, f, backward)
	if st := s.Stats(); st.DemandMisses != 2 {
		t.Fatalf("forward then backward: %d demand misses, want 2 (each pass's first layer)", st.DemandMisses)
	}
	// A repeating forward, then backward: layers 0 and 1, prefetched for
	// a forward that does not come, are released at StartPass.
	s.StartRepeatingPass(forward(4))
	visit(t, s, f, forward(4))
	if h := f.held(); !slices.Equal(h, []string{"b0", "b1", "w0", "w1"}) {
		t.Fatalf("after a repeating pass the fetcher holds %q, want layers 0 and 1", h)
	}
	s.StartPass(backward)
	if c := f.take(); !slices.Equal(c, []string{"release w0,b0", "release w1,b1"}) {
		t.Fatalf("StartPass(backward) after a repeating forward: %q, want layers 0 and 1 released", c)
	}
	visit(t, s, f, backward)
	if h := f.held(); len(h) != 0 {
		t.Fatalf("after backward the fetcher holds %q", h)
	}
}

// TestSmallLayersTakeNoDepth: a layer of under 1/16 of the largest
// layer's bytes (a token embedding and a head of a small vocabulary) is
// prefetched with the window but takes none of its Depth positions: at
// depth 1 the last transformer layer prefetches the head, the next pass's
// embedding and its first transformer layer, so that one is read while
// the last layers compute.
func TestSmallLayersTakeNoDepth(t *testing.T) {
	f := newRec()
	size := func(name string) int64 {
		if name == "w0" || name == "b0" || name == "w4" || name == "b4" {
			return 5
		}
		return 100
	}
	s := policy.NewScheduler(nil, layersOf(5), f, policy.SchedulerOptions{Depth: 1, BudgetBytes: 220, SizeOf: size})
	for pass := range 3 {
		s.StartRepeatingPass(forward(5))
		calls := visit(t, s, f, forward(5))
		if !slices.Equal(calls[3], []string{"prefetch w4,b4", "prefetch w0,b0", "prefetch w1,b1", "release w3,b3"}) {
			t.Fatalf("pass %d, layer 3: %q, want the head, the embedding and layer 1 prefetched", pass, calls[3])
		}
		if !slices.Equal(calls[1], []string{"prefetch w2,b2", "release w1,b1"}) {
			t.Fatalf("pass %d, layer 1: %q, want layer 2 alone prefetched", pass, calls[1])
		}
	}
	if st := s.Stats(); st.DemandMisses != 1 || st.PeakPrefetchedBytes > 220 {
		t.Fatalf("%d demand misses (want 1), peak prefetched %d bytes (budget 220)", st.DemandMisses, st.PeakPrefetchedBytes)
	}
}

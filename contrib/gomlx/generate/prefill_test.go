package generate_test

import (
	"bufio"
	"context"
	"errors"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gomlx/compute/dtypes"

	"github.com/zinfio/zinf/contrib/gomlx/generate"
)

// TestChunkedPrefillEqualsInMemory: a prompt longer than a prefill chunk
// (64 positions on this model) is prefilled chunk by chunk, each over the
// KV cache so far, and the greedy tokens are GoMLX's in-memory
// generator's, which prefills it in one graph: at every chunk boundary
// (a prompt of 1 position, one under a chunk, a chunk, one over, several
// chunks and an odd rest), for a batch of 2, in fp32 and bf16.
func TestChunkedPrefillEqualsInMemory(t *testing.T) {
	for _, dt := range []dtypes.DType{dtypes.Float32, dtypes.BFloat16} {
		t.Run(dt.String(), func(t *testing.T) {
			if dt == dtypes.BFloat16 {
				t.Setenv("GOMLX_FUSION", "false")
			}
			chunkedPrefillEqualsInMemory(t, dt)
		})
	}
}

func chunkedPrefillEqualsInMemory(t *testing.T, dt dtypes.DType) {
	ctx := watchdog(t, 6*time.Minute)
	be := backend(t)
	fn := tiny(dt, 2)
	w := seededWeights(t, be, fn, 42)
	// The GoMLX path's chunks (the native decoder prefills in one pass).
	g := openGenerator(ctx, t, be, nvmeConfig(t, 4<<20, dt == dtypes.BFloat16), fn, w, generate.Options{Decoder: generate.DecoderGoMLX})
	s := generate.Sampling{MaxNewTokens: 6}
	for _, c := range []struct{ n, chunks int }{{1, 1}, {63, 1}, {64, 1}, {65, 2}, {129, 3}, {64*3 + 37, 3 + 3}} {
		ps := prompts(2, c.n, 97, c.n)
		res, err := g.Generate(ctx, ps, s, nil)
		if err != nil {
			t.Fatalf("%d positions: %v", c.n, err)
		}
		if res.PrefillChunks != c.chunks {
			t.Fatalf("%d positions prefilled in %d chunks, want %d", c.n, res.PrefillChunks, c.chunks)
		}
		want, err := generate.InMemory(ctx, be, fn, w, ps, s)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.EqualFunc(res.Tokens, want, slices.Equal) {
			t.Fatalf("a prompt of %d positions (%d chunks): through zinf %v, in memory %v", c.n, res.PrefillChunks, res.Tokens, want)
		}
		if distinct(want) < 3 {
			t.Fatalf("%d positions: degenerate generation %v: the comparison shows nothing", c.n, want)
		}
	}
}

// TestLongPrefillMemoryBounded: a prefill of 2000 positions on a tiny
// model adds little to the process's peak resident set (GoMLX's
// one-graph prefill of it took 800 MiB: a graph of 2000 cache updates,
// each a copy of the cache), well under the printed bound's 512 MiB;
// the figure PrefillBytes gives covers it.
func TestLongPrefillMemoryBounded(t *testing.T) {
	ctx := watchdog(t, 4*time.Minute)
	if _, err := os.Stat("/proc/self/clear_refs"); err != nil {
		t.Skip("no /proc/self/clear_refs to reset the peak resident set")
	}
	be := backend(t)
	fn := tiny(dtypes.Float32, 2)
	g := openGenerator(ctx, t, be, nvmeConfig(t, 4<<20, false), fn, seededWeights(t, be, fn, 7), generate.Options{Decoder: generate.DecoderGoMLX}) // its chunks
	// Warm up (graphs compiled, the runtime's buffers made), then reset
	// the peak: what is left is the prefill's own.
	if _, err := g.Generate(ctx, prompts(1, 100, 97, 1), generate.Sampling{MaxNewTokens: 2}, nil); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile("/proc/self/clear_refs", []byte("5"), 0); err != nil {
		t.Skipf("resetting the peak resident set: %v", err)
	}
	before := procKiB(t, "VmRSS")
	const n = 2000
	res, err := g.Generate(ctx, prompts(1, n, 97, 3), generate.Sampling{MaxNewTokens: 2}, nil)
	if err != nil {
		t.Fatal(err)
	}
	grew := (procKiB(t, "VmHWM") - before) << 10
	figure := g.PrefillBytes(1, n)
	t.Logf("prefill of %d positions: %d chunks, %v; peak resident set +%.1f MiB (PrefillBytes %.1f MiB)", n, res.PrefillChunks, res.Prefill, float64(grew)/(1<<20), float64(figure)/(1<<20))
	if res.PrefillChunks < n/64 {
		t.Fatalf("%d positions prefilled in %d chunks", n, res.PrefillChunks)
	}
	// Generous: the Go heap may double before it is collected.
	if bound := 2 * figure; grew > bound {
		t.Fatalf("a prefill of %d positions grew the peak resident set by %d bytes, over %d (twice PrefillBytes %d)", n, grew, bound, figure)
	}
}

// procKiB is a "Name: N kB" line of /proc/self/status.
func procKiB(t *testing.T, name string) int64 {
	t.Helper()
	f, err := os.Open("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), name+":"); ok {
			n, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return n
		}
	}
	t.Fatalf("no %s in /proc/self/status", name)
	return 0
}

// TestCancelDuringPrefill: a cancel while a long prompt is prefilled (16000
// positions: minutes of attention on this backend) ends Generate within
// 2 s with the context's error, the KV cache and the runtime's buffers
// given back; the Generator generates again, and Close leaves nothing
// in the swap directory.
func TestCancelDuringPrefill(t *testing.T) {
	ctx := watchdog(t, 3*time.Minute)
	be := backend(t)
	fn := tiny(dtypes.Float32, 2)
	cfg := nvmeConfig(t, 4<<20, false)
	g, err := generate.Open(ctx, be, cfg, fn, seededWeights(t, be, fn, 9), generate.Options{Logger: quiet, NoBandwidthProbe: true, Decoder: generate.DecoderGoMLX}) // its chunks
	if err != nil {
		t.Fatal(err)
	}
	closed := false
	defer func() {
		if !closed {
			g.Close()
		}
	}()
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	cancelled := make(chan time.Time, 1)
	timer := time.AfterFunc(500*time.Millisecond, func() {
		cancelled <- time.Now()
		cancel()
	})
	defer timer.Stop()
	prefilled := false
	_, err = g.Generate(cctx, prompts(1, 16000, 97, 5), generate.Sampling{MaxNewTokens: 2}, func(s generate.StepInfo) { prefilled = true })
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled during the prefill: %v", err)
	}
	took := time.Since(<-cancelled)
	if prefilled {
		t.Fatal("the prefill ended before the cancel: the test shows nothing")
	}
	if took > 2*time.Second {
		t.Fatalf("Generate returned %v after the cancel (want within 2s)", took)
	}
	t.Logf("Generate returned %v after the cancel", took)
	if r := g.Runtime().Metrics().Params.ResidentBytes; r != 0 {
		t.Fatalf("after a cancelled prefill %d bytes of weights stay resident", r)
	}
	res, err := g.Generate(ctx, prompts(2, 70, 97, 1), generate.Sampling{MaxNewTokens: 3}, nil)
	if err != nil || res.Generated() != 6 {
		t.Fatalf("after a cancelled prefill: %v, %+v", err, res)
	}
	closed = true
	if err := g.Close(); err != nil {
		t.Fatal(err)
	}
	for _, dir := range cfg.NVMePaths() {
		left, err := os.ReadDir(dir)
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			t.Fatal(err)
		}
		for _, e := range left {
			t.Errorf("left in %s after Close: %s", dir, e.Name())
		}
	}
}

// TestOverlongPromptRefused: a prompt whose prefill needs more memory than
// Options.PrefillBytes is refused by Generate and by PlanBatch before
// anything runs, the error naming the prompt's length, the figure and the
// bound; PlanBatch caps the batch at what the bound allows and says so.
func TestOverlongPromptRefused(t *testing.T) {
	ctx := watchdog(t, 4*time.Minute)
	be := backend(t)
	fn := tiny(dtypes.Float32, 2)
	const bound = 130 << 20
	g := openGenerator(ctx, t, be, nvmeConfig(t, 4<<20, false), fn, seededWeights(t, be, fn, 3), generate.Options{PrefillBytes: bound})
	if got := g.PrefillBound(); got != bound {
		t.Fatalf("PrefillBound %d, want %d", got, bound)
	}
	const n = 6000
	need := g.PrefillBytes(1, n)
	if need <= bound || g.PrefillBytes(1, 100) > bound {
		t.Fatalf("PrefillBytes: %d for %d positions, %d for 100: the test needs the first over %d, the second within", need, n, g.PrefillBytes(1, 100), bound)
	}
	fig := strconv.FormatFloat(float64(need)/(1<<20), 'f', 1, 64) + " MiB"
	for what, err := range map[string]error{
		"Generate": func() error {
			_, err := g.Generate(ctx, prompts(1, n, 97, 1), generate.Sampling{MaxNewTokens: 2}, func(generate.StepInfo) { t.Error("a pass ran") })
			return err
		}(),
		"PlanBatch": func() error { _, err := g.PlanBatch(ctx, n, 2, 4); return err }(),
	} {
		if err == nil {
			t.Fatalf("%s: a prompt of %d positions needing %d bytes to prefill, over %d, was accepted", what, n, need, bound)
		}
		for _, want := range []string{"6000 tokens", fig, "130.0 MiB", "Options.PrefillBytes"} {
			if !strings.Contains(err.Error(), want) {
				t.Fatalf("%s: %v\n(want it to name %q)", what, err, want)
			}
		}
	}
	// A batch: 2 prompts of m positions fit the bound, 3 do not.
	m := 100
	for g.PrefillBytes(3, m) <= bound {
		m += 100
	}
	if g.PrefillBytes(2, m) > bound {
		t.Skipf("no length where 2 prompts fit and 3 do not (%d)", m)
	}
	p, err := g.PlanBatch(ctx, m, 2, 8)
	if err != nil {
		t.Fatal(err)
	}
	if p.Batch != 2 || !strings.Contains(p.Limit, "Options.PrefillBytes") {
		t.Fatalf("plan %+v for prompts of %d: want a batch of 2 set by the prefill's memory", p, m)
	}
	if _, err := g.Generate(ctx, prompts(3, m, 97, 1), generate.Sampling{MaxNewTokens: 2}, nil); err == nil || !strings.Contains(err.Error(), "3 prompt(s) of "+strconv.Itoa(m)+" tokens") {
		t.Fatalf("3 prompts of %d positions over the bound: %v", m, err)
	}
	// Within the bound it generates.
	if _, err := g.Generate(ctx, prompts(2, m, 97, 1), generate.Sampling{MaxNewTokens: 2}, nil); err != nil {
		t.Fatal(err)
	}
}

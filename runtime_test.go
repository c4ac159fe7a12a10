package zinf_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/zinfio/zinf"
	"github.com/zinfio/zinf/aio"
	"github.com/zinfio/zinf/config"
	"github.com/zinfio/zinf/internal/test/faults"
	"github.com/zinfio/zinf/plan"
	"github.com/zinfio/zinf/swapper/optimizer"
	"github.com/zinfio/zinf/tensor"
)

// testConfig is the embedded default with its swap files in a fresh temp
// dir (zinf.direct is "optional" there, so a tmpfs works), an 8 MiB pool,
// and every parameter on NVMe: max_in_cpu 0 keeps the planner from caching
// any in pinned memory.
func testConfig(t *testing.T) (*config.Config, string) {
	t.Helper()
	dir := t.TempDir()
	c := config.Default()
	c.SetScratchDir(dir)
	c.Zinf.Tiers.CPUPinnedBytes = 8 << 20
	c.ZeroOptimization.OffloadParam.MaxInCPU = 0
	return c, dir
}

// oneTensor is a model of one tensor of n elements.
func oneTensor(name string, n int) zinf.Model {
	return zinf.LayeredModel([]tensor.Desc{{Name: name, Shape: []int{n}}})
}

// watchdog returns a context that ends after d. When it ends before the
// test does, the test fails with what the pinned pool of every runtime
// passed to watch holds (a stalled loop waits on pool memory or I/O).
func watchdog(t *testing.T, d time.Duration) (ctx context.Context, watch func(...*zinf.Runtime)) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), d)
	var mu sync.Mutex
	var rts []*zinf.Runtime
	done, finished := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(finished)
		select {
		case <-ctx.Done():
			if !errors.Is(ctx.Err(), context.DeadlineExceeded) {
				return
			}
			mu.Lock()
			defer mu.Unlock()
			var sb strings.Builder
			for _, rt := range rts {
				fmt.Fprintf(&sb, "rank %d of %d, pool holders:\n%s\n", rt.Rank, rt.World, zinf.PoolOf(rt).Holders())
			}
			t.Errorf("watchdog: the test ran past %s\n%s", d, sb.String())
		case <-done:
		}
	}()
	// Cleanup waits for the watchdog, so it never reports after the test
	// is over.
	t.Cleanup(func() {
		close(done)
		<-finished
		cancel()
	})
	return ctx, func(more ...*zinf.Runtime) {
		mu.Lock()
		defer mu.Unlock()
		rts = append(rts, more...)
	}
}

func TestOpenRejectsBadConfig(t *testing.T) {
	m := oneTensor("w", 10)
	c, _ := testConfig(t)
	c.AIO.QueueDepth = 0
	c.ZeroOptimization.OffloadParam.BufferCount = 0
	_, err := zinf.Open(c, m, zinf.Options{})
	if err == nil || !strings.Contains(err.Error(), "aio.queue_depth") || !strings.Contains(err.Error(), "offload_param.buffer_count") {
		t.Fatalf("want both problems named, got %v", err)
	}
	c2 := config.Default() // nvme_path unset
	if _, err := zinf.Open(c2, m, zinf.Options{}); err == nil || !strings.Contains(err.Error(), "nvme_path") {
		t.Fatalf("missing nvme_path: %v", err)
	}
	c3, _ := testConfig(t)
	c3.ZeroOptimization.OffloadParam.NVMePath = "/nonexistent/zinf-nvme"
	if _, err := zinf.Open(c3, m, zinf.Options{}); err == nil || !strings.Contains(err.Error(), "does not exist") {
		t.Fatalf("absent NVMe path: %v", err)
	}
	if _, err := zinf.Open(nil, m, zinf.Options{}); err == nil {
		t.Fatal("Open accepted a nil config")
	}
}

// TestOpenRejectsBadModel: every problem of a model description is
// reported, by tensor, before anything is built.
func TestOpenRejectsBadModel(t *testing.T) {
	c, dir := testConfig(t)
	if _, err := zinf.Open(c, zinf.Model{}, zinf.Options{}); err == nil || !strings.Contains(err.Error(), "no tensors") {
		t.Errorf("empty model: %v", err)
	}
	bad := zinf.Model{Tensors: []tensor.Desc{
		{Name: "a", Shape: []int{4}},
		{Name: "a", Shape: []int{4}},
		{Name: "zero", Shape: []int{3, 0}},
		{Name: "", Shape: []int{1}},
		{Name: "neg", Shape: []int{1}, Layer: -1},
	}}
	_, err := zinf.Open(c, bad, zinf.Options{})
	if err == nil {
		t.Fatal("Open accepted a bad model")
	}
	for _, want := range []string{`"a" is listed twice`, `"zero"`, "tensor 3 has no name", `"neg": layer -1`} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 0 {
		t.Errorf("a refused Open left %d entries in the swap dir", len(ents))
	}
}

// TestInitAndLoopOrder: Init takes the full tensor once; layers and steps
// need every tensor initialized; full-length buffers are required.
func TestInitAndLoopOrder(t *testing.T) {
	ctx, watch := watchdog(t, 2*time.Minute)
	c, _ := testConfig(t)
	m := zinf.LayeredModel([]tensor.Desc{{Name: "a", Shape: []int{2, 3}}}, []tensor.Desc{{Name: "b", Shape: []int{5}}})
	rt, err := zinf.Open(c, m, zinf.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer rt.Close()
	watch(rt)
	if rt.Layers() != 2 || strings.Join(rt.LayerTensors(1), ",") != "b" {
		t.Fatalf("layers %d, layer 1 %v", rt.Layers(), rt.LayerTensors(1))
	}
	if err := rt.Init(ctx, "a", make([]float32, 5)); err == nil || !strings.Contains(err.Error(), "6 elements") {
		t.Errorf("short init: %v", err)
	}
	if err := rt.Init(ctx, "nope", make([]float32, 1)); err == nil || !strings.Contains(err.Error(), "not a tensor of the model") {
		t.Errorf("unknown init: %v", err)
	}
	if err := rt.Init(ctx, "a", []float32{1, 2, 3, 4, 5, 6}); err != nil {
		t.Fatal(err)
	}
	if err := rt.Init(ctx, "a", make([]float32, 6)); err == nil || !strings.Contains(err.Error(), "already initialized") {
		t.Errorf("second init: %v", err)
	}
	if err := rt.BeginLayer(ctx, 1); err == nil || !strings.Contains(err.Error(), `"b" has no initial values`) {
		t.Errorf("begin before init: %v", err)
	}
	if err := rt.Step(ctx); err == nil || !strings.Contains(err.Error(), `"b" has no initial values`) {
		t.Errorf("step before init: %v", err)
	}
	if err := rt.BeginLayer(ctx, 2); err == nil {
		t.Error("BeginLayer accepted layer 2 of 2")
	}
	if err := rt.Init(ctx, "b", make([]float32, 5)); err != nil {
		t.Fatal(err)
	}
	if err := rt.BeginLayer(ctx, 0); err != nil {
		t.Fatal(err)
	}
	got := make([]float32, 6)
	if err := rt.ReadParam(ctx, "a", got[:5]); err == nil || !strings.Contains(err.Error(), "full tensor") {
		t.Errorf("short read buffer: %v", err)
	}
	if err := rt.ReadParam(ctx, "a", got); err != nil || got[5] != 6 {
		t.Errorf("read %v, %v", got, err)
	}
	rt.EndLayer(0)
	if err := rt.AccumulateGrad(ctx, "a", make([]float32, 7)); err == nil {
		t.Error("AccumulateGrad accepted 7 values for 6 elements")
	}
	if err := rt.StepTensor(ctx, "nope"); err == nil {
		t.Error("StepTensor accepted an unknown tensor")
	}
}

func TestCloseRemovesScratchAndFreesPinned(t *testing.T) {
	ctx, watch := watchdog(t, 2*time.Minute)
	c, dir := testConfig(t)
	// No bandwidth probe: its cache file would stay in the path, on
	// purpose (see TestBandwidthProbeAtOpen).
	rt, err := zinf.Open(c, oneTensor("w", 10000), zinf.Options{NoBandwidthProbe: true})
	if err != nil {
		t.Fatal(err)
	}
	watch(rt)
	if got := rt.Placement().Tier["w"]; got != tensor.TierNVMe {
		t.Fatalf("test setup: w planned on %s, want nvme", got)
	}
	if err := rt.Init(ctx, "w", make([]float32, 10000)); err != nil {
		t.Fatal(err)
	}
	if ents, _ := os.ReadDir(dir); len(ents) == 0 {
		t.Fatal("no scratch dirs created")
	}
	if err := rt.Close(); err != nil {
		t.Fatal(err)
	}
	if err := rt.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 0 {
		names := []string{}
		for _, e := range ents {
			names = append(names, e.Name())
		}
		t.Fatalf("scratch left after Close: %v", names)
	}
	if m := rt.Metrics(); m.PinnedInUseBytes != 0 {
		t.Fatalf("%d pinned bytes in use after Close", m.PinnedInUseBytes)
	}
}

// TestStepAllOrNothing: a step that hits ENOSPC changes nothing and a retry
// after space returns gives the fault-free result.
func TestStepAllOrNothing(t *testing.T) {
	ctx, watch := watchdog(t, 2*time.Minute)
	run := func(inject bool) []float32 {
		c, _ := testConfig(t)
		inj := faults.New(1)
		rt, err := zinf.Open(c, oneTensor("w", 5000), zinf.Options{Faults: inj})
		if err != nil {
			t.Fatal(err)
		}
		defer rt.Close()
		watch(rt)
		w := make([]float32, 5000)
		for i := range w {
			w[i] = float32(i%7) / 7
		}
		if err := rt.Init(ctx, "w", w); err != nil {
			t.Fatal(err)
		}
		g := make([]float32, len(w))
		for i := range g {
			g[i] = float32(i%5) / 10
		}
		if err := rt.AccumulateGrad(ctx, "w", g); err != nil {
			t.Fatal(err)
		}
		if inject {
			before, _, _, _ := rt.Optimizer.ReadState(ctx, "w")
			inj.Add(faults.Rule{Kind: faults.Writes, PathContains: filepath.Join("/", "zinf-optim-"), Err: syscall.ENOSPC})
			if err := rt.Step(ctx); err == nil || !strings.Contains(err.Error(), `"w`) {
				t.Fatalf("want ENOSPC naming the tensor, got %v", err)
			} else if !errors.Is(err, aio.ErrNoSpace) {
				t.Fatalf("not ErrNoSpace: %v", err)
			}
			after, _, _, _ := rt.Optimizer.ReadState(ctx, "w")
			for i := range before {
				if before[i] != after[i] {
					t.Fatal("master changed by a failed step")
				}
			}
			if rt.Metrics().Steps != 0 {
				t.Fatal("a failed step was counted")
			}
			inj.Clear()
		}
		if err := rt.Step(ctx); err != nil {
			t.Fatal(err)
		}
		m, _, _, err := rt.Optimizer.ReadState(ctx, "w")
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
	clean, retried := run(false), run(true)
	for i := range clean {
		if clean[i] != retried[i] {
			t.Fatalf("element %d: %v after retry, %v fault-free", i, retried[i], clean[i])
		}
	}
}

// adamRef is the in-memory reference a run is compared with: the full
// tensors, updated with optimizer.Adam.
type adamRef struct {
	hyper   optimizer.Hyper
	step    int
	w, m, v map[string][]float32
}

func newAdamRef(cfg *config.Config, init map[string][]float32) *adamRef {
	r := &adamRef{hyper: plan.Hyper(cfg), w: map[string][]float32{}, m: map[string][]float32{}, v: map[string][]float32{}}
	for name, w := range init {
		r.w[name] = append([]float32(nil), w...)
		r.m[name] = make([]float32, len(w))
		r.v[name] = make([]float32, len(w))
	}
	return r
}

// apply is one step with the given full gradients.
func (r *adamRef) apply(grads map[string][]float32) {
	r.step++
	for name, g := range grads {
		optimizer.Adam(r.w[name], g, r.m[name], r.v[name], r.step, r.hyper)
	}
}

// initValues gives every tensor of m deterministic values in [-1, 1).
func initValues(m zinf.Model) map[string][]float32 {
	out := map[string][]float32{}
	for k, d := range m.Tensors {
		n, _ := d.Numel()
		w := make([]float32, n)
		for i := range w {
			w[i] = float32((i*31+k*17)%101)/50.5 - 1
		}
		out[d.Name] = w
	}
	return out
}

// gradOf is the gradient of 0.5*||w - target||^2, target[i] = (i%7)/7.
func gradOf(w []float32) []float32 {
	g := make([]float32, len(w))
	for i := range w {
		g[i] = w[i] - float32(i%7)/7
	}
	return g
}

// trainLoop runs steps of the README's loop on the ranks rts of one job
// (every rank gets the same full gradient, as after an all-reduce): a
// forward pass, then a backward pass that swaps each layer in, reads its
// weights, accumulates their gradient, hands them to the optimizer and
// releases the layer; then Step. Every weight read is checked bit for bit
// against ref, which is stepped alongside.
func trainLoop(ctx context.Context, t *testing.T, rts []*zinf.Runtime, ref *adamRef, steps int) {
	t.Helper()
	layers := rts[0].Layers()
	read := func(l int) map[string][]float32 {
		t.Helper()
		for _, rt := range rts {
			if err := rt.BeginLayer(ctx, l); err != nil {
				t.Fatalf("step %d: rank %d: %v", ref.step+1, rt.Rank, err)
			}
		}
		out := map[string][]float32{}
		for _, name := range rts[0].LayerTensors(l) {
			full := make([]float32, len(ref.w[name]))
			for i := range full {
				full[i] = float32(math.NaN())
			}
			for _, rt := range rts {
				if err := rt.ReadParam(ctx, name, full); err != nil {
					t.Fatalf("step %d: rank %d: %v", ref.step+1, rt.Rank, err)
				}
			}
			for i, want := range ref.w[name] {
				if math.Float32bits(full[i]) != math.Float32bits(want) {
					t.Fatalf("step %d: %s[%d] reads %v, in-memory Adam has %v", ref.step, name, i, full[i], want)
				}
			}
			out[name] = full
		}
		return out
	}
	for range steps {
		for _, rt := range rts {
			rt.Forward()
		}
		for l := range layers {
			read(l)
			for _, rt := range rts {
				rt.EndLayer(l)
			}
		}
		for _, rt := range rts {
			rt.Backward()
		}
		grads := map[string][]float32{}
		for l := layers - 1; l >= 0; l-- {
			for name, w := range read(l) {
				g := gradOf(w)
				grads[name] = g
				for _, rt := range rts {
					if err := rt.AccumulateGrad(ctx, name, g); err != nil {
						t.Fatalf("step %d: rank %d: %v", ref.step+1, rt.Rank, err)
					}
					if err := rt.StepTensor(ctx, name); err != nil {
						t.Fatalf("step %d: rank %d: %v", ref.step+1, rt.Rank, err)
					}
				}
			}
			for _, rt := range rts {
				rt.EndLayer(l)
			}
		}
		for _, rt := range rts {
			if err := rt.Step(ctx); err != nil {
				t.Fatalf("step %d: rank %d: %v", ref.step+1, rt.Rank, err)
			}
		}
		ref.apply(grads)
	}
	// The weights after the last step.
	for _, rt := range rts {
		rt.Forward()
	}
	for l := range layers {
		read(l)
		for _, rt := range rts {
			rt.EndLayer(l)
		}
	}
	for _, rt := range rts {
		if got := rt.Metrics().Steps; got != ref.step {
			t.Fatalf("rank %d counts %d steps, want %d", rt.Rank, got, ref.step)
		}
	}
}

// initAll gives every rank the model's initial values.
func initAll(ctx context.Context, t *testing.T, rts []*zinf.Runtime, init map[string][]float32) {
	t.Helper()
	for _, rt := range rts {
		for name, w := range init {
			if err := rt.Init(ctx, name, w); err != nil {
				t.Fatalf("rank %d: %v", rt.Rank, err)
			}
		}
	}
}

// readmeModel is 8 layers of one 1 MiB fp32 tensor each.
func readmeModel() zinf.Model {
	var layers [][]tensor.Desc
	for l := range 8 {
		layers = append(layers, []tensor.Desc{{Name: fmt.Sprintf("layer%d.w", l), Shape: []int{256, 1024}}})
	}
	return zinf.LayeredModel(layers...)
}

// TestReadmeLoopSmallPool is the README's loop with a 4 MiB pool and eight
// 1 MiB tensors on NVMe: Open either refuses the pool, naming the key and
// the minimum, or the loop trains. At exactly the minimum it trains, bit
// for bit as in-memory Adam; one granule below, Open refuses.
func TestReadmeLoopSmallPool(t *testing.T) {
	ctx, watch := watchdog(t, 5*time.Minute)
	model := readmeModel()
	init := initValues(model)
	open := func(pool int64) (*zinf.Runtime, *config.Config, error) {
		t.Helper()
		c, _ := testConfig(t)
		c.Zinf.Tiers.CPUPinnedBytes = config.Size(pool)
		rt, err := zinf.Open(c, model, zinf.Options{})
		if err == nil {
			t.Cleanup(func() { rt.Close() })
			watch(rt)
		}
		return rt, c, err
	}
	// tooSmall checks err is the refusal of a pool of have bytes and
	// returns the minimum it names.
	tooSmall := func(err error, have int64) int64 {
		t.Helper()
		var pe *zinf.PoolTooSmallError
		if !errors.As(err, &pe) || !errors.Is(err, zinf.ErrPoolTooSmall) {
			t.Fatalf("pool of %d bytes: want a *zinf.PoolTooSmallError, got %v", have, err)
		}
		msg := err.Error()
		if !strings.Contains(msg, "zinf.tiers.cpu_pinned_bytes") || !strings.Contains(msg, strconv.FormatInt(pe.Need, 10)) {
			t.Fatalf("the refusal does not name zinf.tiers.cpu_pinned_bytes and the minimum %d: %s", pe.Need, msg)
		}
		if pe.Have != have || pe.Need <= have || pe.Res.MinPoolBytes != pe.Need {
			t.Fatalf("refusal: have %d need %d (min %d), for a pool of %d", pe.Have, pe.Need, pe.Res.MinPoolBytes, have)
		}
		return pe.Need
	}

	var minPool, granule int64
	rt, c, err := open(4 << 20)
	if err != nil {
		minPool = tooSmall(err, 4<<20)
		granule = err.(*zinf.PoolTooSmallError).Res.GranuleBytes
		t.Logf("4 MiB refused: the minimum is %d bytes", minPool)
	} else {
		if got := rt.Placement().Tier["layer0.w"]; got != tensor.TierNVMe {
			t.Fatalf("test setup: layer0.w planned on %s, want nvme", got)
		}
		initAll(ctx, t, []*zinf.Runtime{rt}, init)
		trainLoop(ctx, t, []*zinf.Runtime{rt}, newAdamRef(c, init), 2)
		minPool, granule = rt.Reservations().MinPoolBytes, rt.Reservations().GranuleBytes
		rt.Close()
	}
	if granule <= 0 || minPool%granule != 0 {
		t.Fatalf("minimum pool %d is not a whole number of %d-byte granules", minPool, granule)
	}

	rt, c, err = open(minPool)
	if err != nil {
		t.Fatalf("a pool of exactly the minimum %d bytes: %v", minPool, err)
	}
	if r := rt.Reservations(); r.MinPoolBytes != minPool || r.PoolBytes != minPool || r.PrefetchBytes != 0 {
		t.Fatalf("reservations at the minimum: %+v", r)
	}
	initAll(ctx, t, []*zinf.Runtime{rt}, init)
	trainLoop(ctx, t, []*zinf.Runtime{rt}, newAdamRef(c, init), 2)
	if m := rt.Metrics(); m.BytesRead == 0 || m.BytesWritten == 0 || m.PinnedPeakBytes > minPool {
		t.Fatalf("metrics at the minimum pool: read %d written %d, peak pinned %d of %d", m.BytesRead, m.BytesWritten, m.PinnedPeakBytes, minPool)
	}
	rt.Close()

	_, _, err = open(minPool - granule)
	if got := tooSmall(err, minPool-granule); got != minPool {
		t.Fatalf("one granule below, the refusal names %d as the minimum, want %d", got, minPool)
	}
}

// TestEmptyPartitions: world 4 with tensors of 5 and 3 elements, so some
// ranks hold one element and rank 3 holds none of the second; four
// runtimes in one process, each with its own swap dir, train in lockstep
// bit for bit as in-memory Adam, on every parameter tier.
func TestEmptyPartitions(t *testing.T) {
	for _, dev := range []config.OffloadDevice{config.OffloadNVMe, config.OffloadCPU, config.OffloadNone} {
		t.Run(string(dev), func(t *testing.T) {
			ctx, watch := watchdog(t, 3*time.Minute)
			model := zinf.LayeredModel(
				[]tensor.Desc{{Name: "five", Shape: []int{5}}},
				[]tensor.Desc{{Name: "three", Shape: []int{3}}},
			)
			const world = 4
			var rts []*zinf.Runtime
			var c *config.Config
			for r := range world {
				c, _ = testConfig(t)
				c.ZeroOptimization.OffloadParam.Device = dev
				rt, err := zinf.Open(c, model, zinf.Options{Rank: r, WorldSize: world})
				if err != nil {
					t.Fatalf("rank %d: %v", r, err)
				}
				t.Cleanup(func() { rt.Close() })
				watch(rt)
				rts = append(rts, rt)
			}
			if lo, hi := rts[3].Partition("three"); lo != hi {
				t.Fatalf("test setup: rank 3 holds [%d, %d) of three, want nothing", lo, hi)
			}
			init := initValues(model)
			initAll(ctx, t, rts, init)
			trainLoop(ctx, t, rts, newAdamRef(c, init), 3)
			for _, rt := range rts {
				if err := rt.Close(); err != nil {
					t.Fatalf("rank %d: close: %v", rt.Rank, err)
				}
			}
		})
	}
}

// TestMetricsDuringStep: Metrics may be called from another goroutine
// while the loop runs (run with -race).
func TestMetricsDuringStep(t *testing.T) {
	ctx, watch := watchdog(t, 3*time.Minute)
	c, _ := testConfig(t)
	c.ZeroOptimization.SubGroupSize = 1000 // several sub-groups per step
	model := zinf.LayeredModel(
		[]tensor.Desc{{Name: "a", Shape: []int{64, 64}}},
		[]tensor.Desc{{Name: "b", Shape: []int{4000}}},
		[]tensor.Desc{{Name: "c", Shape: []int{3, 7}}},
	)
	rt, err := zinf.Open(c, model, zinf.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer rt.Close()
	watch(rt)
	init := initValues(model)
	initAll(ctx, t, []*zinf.Runtime{rt}, init)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var polls, maxSteps int
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			m := rt.Metrics()
			maxSteps = max(maxSteps, m.Steps)
			polls++
			_ = rt.Placement()
			_ = rt.Reservations()
		}
	}()
	trainLoop(ctx, t, []*zinf.Runtime{rt}, newAdamRef(c, init), 4)
	close(stop)
	wg.Wait()
	if polls == 0 || maxSteps > 4 {
		t.Fatalf("%d polls, at most %d steps seen", polls, maxSteps)
	}
	if m := rt.Metrics(); m.Steps != 4 || m.BytesWritten == 0 || m.Engine.WriteOps == 0 {
		t.Fatalf("metrics after 4 steps: %+v", m)
	}
}

package zinf

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/zinfio/zinf/aio"
	"github.com/zinfio/zinf/checkpoint"
	"github.com/zinfio/zinf/comm"
	"github.com/zinfio/zinf/config"
	"github.com/zinfio/zinf/swapper"
	"github.com/zinfio/zinf/tensor"
)

var quietLog = slog.New(slog.NewTextHandler(io.Discard, nil))

// ckptParam is one parameter of a test model.
type ckptParam struct {
	name  string
	numel int
	layer int
	// tier is where the test wants the parameter. The planner decides:
	// openRanksOf sets offload_param.device so that it places the params
	// as listed (all NVMe, all CPU or all GPU: max_in_cpu is the parameter
	// swapper's cache in front of NVMe, not a tier of its own) and checks
	// that it did.
	tier swapper.Tier
}

// ckptParams are the test model: odd sizes, so partitions are uneven, on
// NVMe, with block.0.w (used first) small enough for the max_in_cpu cache.
var ckptParams = []ckptParam{
	{"block.0.w", 640, 0, swapper.TierNVMe},
	{"embed", 1001, 1, swapper.TierNVMe},
	{"block.0.b", 13, 1, swapper.TierNVMe},
}

// modelOf is the Model of params.
func modelOf(params []ckptParam) Model {
	m := Model{}
	for _, p := range params {
		m.Tensors = append(m.Tensors, tensor.Desc{Name: p.name, Shape: []int{p.numel}, Layer: p.layer})
	}
	return m
}

// placeAs sets the config keys that make the planner place params as
// listed: offload_param.device from the (single) tier, and for an NVMe
// model a max_in_cpu cache that holds the first parameter's partition.
func placeAs(t *testing.T, cfg *config.Config, params []ckptParam, world int) {
	t.Helper()
	var cpu, nvme, gpu bool
	for _, p := range params {
		switch p.tier {
		case swapper.TierCPU:
			cpu = true
		case swapper.TierNVMe:
			nvme = true
		case swapper.TierGPU:
			gpu = true
		}
	}
	zo := &cfg.ZeroOptimization.OffloadParam
	switch {
	case nvme && !cpu && !gpu:
		zo.Device = config.OffloadNVMe
		// The first parameter's partition fits the cache in front of NVMe.
		zo.MaxInCPU = int64((params[0].numel + world - 1) / world)
	case cpu && !gpu && !nvme:
		zo.Device = config.OffloadCPU
		zo.MaxInCPU = 0
	case gpu && !cpu && !nvme:
		zo.Device = config.OffloadNone
		zo.MaxInCPU = 0
	default:
		t.Fatal("test model mixes parameter tiers: no config places it so")
	}
}

// openRanks opens world runtimes with their own swap directories and
// initializes ckptParams with values from seed.
func openRanks(t *testing.T, world int, dt swapper.DType, seed uint64, mutate ...func(*config.Config)) []*Runtime {
	t.Helper()
	return openRanksOf(t, ckptParams, world, dt, seed, mutate...)
}

// openRanksOf is openRanks with the model params.
func openRanksOf(t *testing.T, params []ckptParam, world int, dt swapper.DType, seed uint64, mutate ...func(*config.Config)) []*Runtime {
	t.Helper()
	cfg := config.Default()
	cfg.SetScratchDir(t.TempDir())
	cfg.Zinf.Tiers.CPUPinnedBytes = 16 << 20
	cfg.ZeroOptimization.SubGroupSize = 300 // several sub-groups per partition
	cfg.BF16 = dt == swapper.BFloat16
	cfg.FP16 = dt == swapper.Float16
	placeAs(t, cfg, params, world)
	for _, m := range mutate {
		m(cfg)
	}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	var rts []*Runtime
	comms, err := comm.NewLocal(world, comm.LocalOptions{StallTimeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	for r := range world {
		rt, err := Open(cfg, modelOf(params), Options{Logger: quietLog, Rank: r, WorldSize: world, Comm: comms[r]})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { rt.Close() })
		for _, p := range params {
			if got := rt.Placement().Tier[p.name]; got != p.tier {
				t.Fatalf("test setup: rank %d of %d: the plan put %s on %s, want %s", r, world, p.name, got, p.tier)
			}
		}
		rts = append(rts, rt)
	}
	rng := rand.New(rand.NewPCG(seed, 1))
	for _, p := range params {
		master := make([]float32, p.numel)
		for i := range master {
			master[i] = rng.Float32()*2 - 1
		}
		for _, rt := range rts {
			if err := rt.Init(context.Background(), p.name, master); err != nil {
				t.Fatal(err)
			}
		}
	}
	return rts
}

// fullState is every parameter's full compute values and optimizer
// states, gathered from the ranks, and the optimizer step count.
type fullState struct {
	step int
	t    map[string][]float32
}

func gatherState(t *testing.T, rts []*Runtime) fullState {
	t.Helper()
	return gatherStateOf(t, rts, ckptParams)
}

// gatherStateOf is gatherState of the model params.
func gatherStateOf(t *testing.T, rts []*Runtime, params []ckptParam) fullState {
	t.Helper()
	ctx := context.Background()
	out := fullState{step: rts[0].Optimizer.StepCount(), t: map[string][]float32{}}
	for _, p := range params {
		vals := make([][]float32, 4)
		for k := range vals {
			vals[k] = make([]float32, p.numel)
		}
		for _, rt := range rts {
			lo, hi := rt.Partition(p.name)
			if err := rt.Params.SwapIn(ctx, p.name); err != nil {
				t.Fatal(err)
			}
			err := rt.Params.ReadFloat32(ctx, p.name, vals[0][lo:hi])
			rt.Params.Release(p.name)
			if err != nil {
				t.Fatal(err)
			}
			m, a, v, err := rt.Optimizer.ReadState(ctx, p.name)
			if err != nil {
				t.Fatal(err)
			}
			copy(vals[1][lo:], m)
			copy(vals[2][lo:], a)
			copy(vals[3][lo:], v)
		}
		for k, what := range []string{"", ".master", ".exp_avg", ".exp_avg_sq"} {
			out.t[p.name+what] = vals[k]
		}
	}
	return out
}

func (a fullState) diff(b fullState) string {
	if a.step != b.step {
		return fmt.Sprintf("optimizer step %d vs %d", a.step, b.step)
	}
	for k, v := range a.t {
		w := b.t[k]
		if len(v) != len(w) {
			return fmt.Sprintf("%s: %d vs %d elements", k, len(v), len(w))
		}
		for i := range v {
			if math.Float32bits(v[i]) != math.Float32bits(w[i]) {
				return fmt.Sprintf("%s[%d]: %v vs %v", k, i, v[i], w[i])
			}
		}
	}
	return ""
}

// setStates gives every rank's optimizer states and parameters values
// from seed (as a run of step steps would), so nothing is at its initial
// value.
func setStates(t *testing.T, rts []*Runtime, dt swapper.DType, seed uint64, step int) {
	t.Helper()
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(seed, 2))
	for _, p := range ckptParams {
		full := make([][]float32, 3)
		for k := range full {
			full[k] = make([]float32, p.numel)
			for i := range full[k] {
				full[k][i] = rng.Float32()
			}
		}
		for _, rt := range rts {
			lo, hi := rt.Partition(p.name)
			if err := rt.Optimizer.LoadState(ctx, p.name, full[0][lo:hi], full[1][lo:hi], full[2][lo:hi], step); err != nil {
				t.Fatal(err)
			}
			if _, err := rt.Params.StageUpdate(ctx, p.name, full[0][lo:hi]); err != nil {
				t.Fatal(err)
			}
		}
	}
	for _, rt := range rts {
		if err := rt.Params.CommitUpdates(); err != nil {
			t.Fatal(err)
		}
	}
}

// optimizerInMemory keeps the optimizer states in pinned memory.
func optimizerInMemory(c *config.Config) {
	c.ZeroOptimization.OffloadOptimizer.Device = config.OffloadCPU
}

func TestCheckpointRoundTripRepartition(t *testing.T) {
	for _, c := range []struct {
		from, to int
		dt       swapper.DType
		memOpt   bool // optimizer states in memory on the saving side
	}{{1, 1, swapper.Float32, false}, {3, 2, swapper.Float32, false}, {2, 5, swapper.BFloat16, true}, {4, 1, swapper.Float16, false}, {2, 3, swapper.Float32, true}} {
		t.Run(fmt.Sprintf("%s-%dto%d-memopt=%v", c.dt, c.from, c.to, c.memOpt), func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			var mutate []func(*config.Config)
			if c.memOpt {
				mutate = append(mutate, optimizerInMemory)
			}
			src := openRanks(t, c.from, c.dt, 1, mutate...)
			lo, hi := src[0].Partition("embed")
			if _, stored := storedStates(src[0], "embed", hi-lo); stored == c.memOpt {
				t.Fatalf("optimizer states from the store: %v, want %v", stored, !c.memOpt)
			}
			setStates(t, src, c.dt, 3, 7)
			want := gatherState(t, src)
			dir := filepath.Join(t.TempDir(), "step-000042")
			m, err := SaveCheckpoint(ctx, dir, src, CheckpointMeta{Step: 42, User: map[string]string{"run": "test"}}, checkpoint.SaveOptions{Logger: quietLog})
			if err != nil {
				t.Fatal(err)
			}
			if m.WorldSize != c.from || m.Step != 42 {
				t.Fatalf("manifest: world %d step %d", m.WorldSize, m.Step)
			}
			dst := openRanks(t, c.to, c.dt, 2)
			if d := want.diff(gatherState(t, dst)); d == "" {
				t.Fatal("test broken: the fresh runtimes already equal the saved ones")
			}
			meta, err := LoadCheckpoint(ctx, dir, dst)
			if err != nil {
				t.Fatal(err)
			}
			if meta.Step != 42 || meta.User["run"] != "test" || len(meta.User) != 1 {
				t.Fatalf("loaded meta %+v", meta)
			}
			if d := want.diff(gatherState(t, dst)); d != "" {
				t.Fatalf("after loading into world %d: %s", c.to, d)
			}
		})
	}
}

func TestCheckpointMetadata(t *testing.T) {
	ctx := context.Background()
	rts := openRanks(t, 2, swapper.BFloat16, 1)
	setStates(t, rts, swapper.BFloat16, 4, 3)
	dir := filepath.Join(t.TempDir(), "step-000003")
	shape := map[string][]int64{"embed": {7, 11, 13}, "block.0.w": {20, 32}, "block.0.b": {13}}
	if _, err := SaveCheckpoint(ctx, dir, rts, CheckpointMeta{Step: 3, ModelShape: shape}, checkpoint.SaveOptions{Logger: quietLog}); err != nil {
		t.Fatal(err)
	}
	if _, err := checkpoint.Verify(ctx, dir); err != nil {
		t.Fatal(err)
	}
	r, err := checkpoint.OpenRank(dir, 1)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	meta := r.Meta()
	if err := r.CheckModelShape(shape); err != nil {
		t.Fatal(err)
	}
	if meta.User[metaOptimizerStep] != "3" || meta.User[metaParamDType] != "bf16" || meta.User[metaKind] != kindTraining {
		t.Fatalf("metadata %v", meta.User)
	}
	if _, err := config.Parse(meta.Config); err != nil {
		t.Fatalf("saved config does not parse: %v", err)
	}
	lo, hi := rts[1].Partition("embed")
	if want := fmt.Sprintf(`"embed":[%d,%d,1001]`, lo, hi); !strings.Contains(meta.User[metaPartitions], want) {
		t.Fatalf("partitions %s lack %s", meta.User[metaPartitions], want)
	}
	for _, name := range []string{"embed", "embed.master", "embed.exp_avg", "embed.exp_avg_sq"} {
		ti, err := r.Tensor(name)
		if err != nil {
			t.Fatal(err)
		}
		wantFile, wantDT := CheckpointOptimizerFile, swapper.Float32
		if name == "embed" {
			wantFile, wantDT = CheckpointParamsFile, swapper.BFloat16
		}
		if ti.File != wantFile || ti.DType != wantDT || len(ti.Shape) != 1 || ti.Shape[0] != int64(hi-lo) {
			t.Fatalf("%s: %+v", name, ti)
		}
	}
}

// TestSaveCheckpointAsyncSnapshot: after SaveCheckpointAsync returns, the
// runtimes may change; the checkpoint holds the values they had.
func TestSaveCheckpointAsyncSnapshot(t *testing.T) {
	ctx := context.Background()
	rts := openRanks(t, 2, swapper.Float32, 1)
	setStates(t, rts, swapper.Float32, 5, 2)
	want := gatherState(t, rts)
	s := checkpoint.NewSaver(checkpoint.SaverOptions{Logger: quietLog})
	defer s.Close()
	dir := filepath.Join(t.TempDir(), "step-000002")
	h, err := SaveCheckpointAsync(ctx, s, dir, rts, CheckpointMeta{Step: 2}, checkpoint.SaveOptions{Logger: quietLog})
	if err != nil {
		t.Fatal(err)
	}
	setStates(t, rts, swapper.Float32, 6, 3) // training goes on
	if _, err := h.Wait(); err != nil {
		t.Fatal(err)
	}
	dst := openRanks(t, 3, swapper.Float32, 2)
	if _, err := LoadCheckpoint(ctx, dir, dst); err != nil {
		t.Fatal(err)
	}
	if d := want.diff(gatherState(t, dst)); d != "" {
		t.Fatalf("the async checkpoint does not hold the state at SaveCheckpointAsync: %s", d)
	}
}

func TestCheckpointBadInput(t *testing.T) {
	ctx := context.Background()
	rts := openRanks(t, 2, swapper.Float32, 1)
	root := t.TempDir()
	save := func(rts []*Runtime, meta CheckpointMeta) error {
		_, err := SaveCheckpoint(ctx, filepath.Join(root, "x"), rts, meta, checkpoint.SaveOptions{Logger: quietLog})
		return err
	}
	for _, c := range []struct {
		name string
		err  error
		want string
	}{
		{"no-runtimes", save(nil, CheckpointMeta{}), "no runtimes"},
		{"out-of-order", save([]*Runtime{rts[1], rts[0]}, CheckpointMeta{}), "rank order"},
		{"missing-rank", save(rts[:1], CheckpointMeta{}), "rank order"},
		{"reserved-key", save(rts, CheckpointMeta{User: map[string]string{"zinf.kind": "x"}}), "reserved"},
		{"shape-numel", save(rts, CheckpointMeta{ModelShape: map[string][]int64{"embed": {1000}, "block.0.w": {640}, "block.0.b": {13}}}), `"embed"`},
		{"shape-extra", save(rts, CheckpointMeta{ModelShape: map[string][]int64{"embed": {1001}, "block.0.w": {640}, "block.0.b": {13}, "head": {3}}}), `"head"`},
		{"shape-missing", save(rts, CheckpointMeta{ModelShape: map[string][]int64{"embed": {1001}, "block.0.w": {640}}}), `"block.0.b"`},
	} {
		if c.err == nil || !strings.Contains(c.err.Error(), c.want) {
			t.Errorf("%s: got %v, want an error containing %s", c.name, c.err, c.want)
		}
	}

	// Loading what is not a training checkpoint.
	if _, err := LoadCheckpoint(ctx, filepath.Join(root, "missing"), rts); !errors.Is(err, checkpoint.ErrNotCheckpoint) {
		t.Errorf("missing dir: %v", err)
	}
	plain := filepath.Join(root, "plain")
	st := checkpoint.State{Step: 1, Ranks: []checkpoint.RankState{{Rank: 0, Files: []checkpoint.TensorFile{{Name: "a.safetensors",
		Tensors: []checkpoint.Tensor{checkpoint.FromBytes("w", swapper.Float32, []int64{1}, make([]byte, 4))}}}}}}
	if _, err := checkpoint.Save(ctx, plain, st, checkpoint.SaveOptions{Logger: quietLog}); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadCheckpoint(ctx, plain, rts); !errors.Is(err, checkpoint.ErrNotCheckpoint) || !strings.Contains(err.Error(), "training checkpoint") {
		t.Errorf("plain checkpoint: %v", err)
	}
}

// TestCheckpointStateSavedTwice: a State from CheckpointState may be saved
// more than once (a Writer retrying, say); its lazy sources start over.
func TestCheckpointStateSavedTwice(t *testing.T) {
	ctx := context.Background()
	src := openRanks(t, 2, swapper.BFloat16, 1, optimizerInMemory)
	setStates(t, src, swapper.BFloat16, 8, 4)
	want := gatherState(t, src)
	st, err := CheckpointState(src, CheckpointMeta{Step: 4})
	if err != nil {
		t.Fatal(err)
	}
	w := checkpoint.NewWriter()
	defer w.Close()
	root := t.TempDir()
	for _, name := range []string{"a", "b"} {
		if _, err := w.Save(ctx, filepath.Join(root, name), st, checkpoint.SaveOptions{Logger: quietLog}); err != nil {
			t.Fatal(err)
		}
		dst := openRanks(t, 3, swapper.BFloat16, 2)
		if _, err := LoadCheckpoint(ctx, filepath.Join(root, name), dst); err != nil {
			t.Fatal(err)
		}
		if d := want.diff(gatherState(t, dst)); d != "" {
			t.Fatalf("save %s: %s", name, d)
		}
	}
}

// pinnedParams is a model whose state is all in memory (with
// optimizerInMemory): CPU-tier parameters (offload_param.device "cpu").
var pinnedParams = []ckptParam{
	{"embed", 1001, 0, swapper.TierCPU},
	{"block.0.w", 640, 1, swapper.TierCPU},
	{"block.0.b", 13, 1, swapper.TierCPU},
}

// gpuParams is pinnedParams with every parameter on the GPU tier
// (offload_param.device "none"): the optimizer states are still in pinned
// memory.
var gpuParams = []ckptParam{
	{"embed", 1001, 0, swapper.TierGPU},
	{"block.0.w", 640, 1, swapper.TierGPU},
	{"block.0.b", 13, 1, swapper.TierGPU},
}

// trainSteps runs n training steps on every rank, with gradients from
// seed (each rank its own: a data-parallel job before the all-reduce).
// Each step must finish within 30 s: a step that waits longer fails
// the test with what the ranks' pools hold.
func trainSteps(t *testing.T, rts []*Runtime, params []ckptParam, seed uint64, n int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	rng := rand.New(rand.NewPCG(seed, 3))
	for range n {
		for _, rt := range rts {
			for _, p := range params {
				lo, hi := rt.Partition(p.name)
				g := make([]float32, hi-lo)
				for i := range g {
					g[i] = rng.Float32() - 0.5
				}
				if err := rt.grads.Accumulate(ctx, p.name, g); err != nil {
					t.Fatal(err)
				}
			}
		}
		// The ranks step together: with fp16 their steps reduce the
		// overflow check over the world.
		errs := make([]error, len(rts))
		var wg sync.WaitGroup
		for i, rt := range rts {
			wg.Go(func() { errs[i] = rt.Step(ctx) })
		}
		wg.Wait()
		for i, err := range errs {
			if err != nil {
				if ctx.Err() != nil {
					t.Fatalf("rank %d: step: %v; the pools hold:\n%s", i, err, holders(rts))
				}
				t.Fatal(err)
			}
		}
	}
}

// holders describes what each rank's pinned pool holds.
func holders(rts []*Runtime) string {
	var sb strings.Builder
	for _, rt := range rts {
		fmt.Fprintf(&sb, "rank %d: %s\n", rt.Rank, rt.pool.Holders())
	}
	return sb.String()
}

// outstanding is each rank's pool buffers outstanding.
func outstanding(rts []*Runtime) []int64 {
	out := make([]int64, len(rts))
	for i, rt := range rts {
		out[i] = rt.pool.Stats().Outstanding
	}
	return out
}

// TestSaveCheckpointAsyncPinnedMemory: with every state in pinned memory
// (CPU-tier params, optimizer states in memory), SaveCheckpointAsync pins
// the copy-on-write buffers instead of copying them; training steps while
// the save drains (its writes held back until then), and the checkpoint
// holds, bit for bit, the state at the SaveCheckpointAsync call (also with
// the parameters on the GPU tier and only the optimizer states pinned). The
// snapshots' buffers go back to the runtimes' pools when the save is done,
// and the runtimes close clean.
func TestSaveCheckpointAsyncPinnedMemory(t *testing.T) {
	for name, params := range map[string][]ckptParam{"cpu": pinnedParams, "gpu": gpuParams} {
		t.Run(name, func(t *testing.T) { testSaveAsyncPinned(t, params) })
	}
}

func testSaveAsyncPinned(t *testing.T, params []ckptParam) {
	// A watchdog: the save and the training beside it must not stall on
	// pinned memory; when they do, the error says what the pools hold.
	ctx, cancel := context.WithTimeout(t.Context(), 45*time.Second)
	defer cancel()
	rts := openRanksOf(t, params, 2, swapper.BFloat16, 1, optimizerInMemory)
	trainSteps(t, rts, params, 7, 2)
	base := outstanding(rts)
	want := gatherStateOf(t, rts, params)
	gate := &writeGate{open: make(chan struct{})}
	defer gate.release()
	eng, err := aio.New(aio.Options{Direct: aio.DirectOptional, Faults: gate, Logger: quietLog})
	if err != nil {
		t.Fatal(err)
	}
	defer eng.Close()
	s := checkpoint.NewSaver(checkpoint.SaverOptions{Logger: quietLog})
	defer s.Close()
	defer gate.release() // before closing the saver, which waits for the held writes
	dir := filepath.Join(t.TempDir(), "step-000002")
	// Small staging buffers, one per file: the drain stops at its first
	// write, so most pinned bytes are read only after training moved on.
	h, err := SaveCheckpointAsync(ctx, s, dir, rts, CheckpointMeta{Step: 2},
		checkpoint.SaveOptions{Logger: quietLog, Engine: eng, StagingBytes: 4096, StagingBuffers: 1})
	if err != nil {
		t.Fatalf("%v; the pools hold:\n%s", err, holders(rts))
	}
	// Training goes on while the save drains: three steps, so every
	// optimizer record held by the save would have been written again.
	trainSteps(t, rts, params, 8, 3)
	after := gatherStateOf(t, rts, params)
	for name, v := range after.t {
		if want.diff(fullState{step: want.step, t: map[string][]float32{name: v}}) == "" {
			t.Fatalf("test broken: training did not change %s", name)
		}
	}
	select {
	case <-h.Done():
		t.Fatal("test broken: the save finished with its writes held")
	default:
	}
	gate.release()
	if _, err := h.Wait(); err != nil {
		t.Fatal(err)
	}
	if got := outstanding(rts); !slices.Equal(got, base) {
		t.Fatalf("pool buffers outstanding after the save %v, before it %v", got, base)
	}
	dst := openRanksOf(t, params, 3, swapper.BFloat16, 2, optimizerInMemory)
	if _, err := LoadCheckpoint(ctx, dir, dst); err != nil {
		t.Fatal(err)
	}
	if d := want.diff(gatherStateOf(t, dst, params)); d != "" {
		t.Fatalf("the async checkpoint does not hold the state at SaveCheckpointAsync: %s", d)
	}
	// Resuming from it and training on matches the source trained on from
	// the same point (same world size, same gradients).
	again := openRanksOf(t, params, 2, swapper.BFloat16, 3, optimizerInMemory)
	if _, err := LoadCheckpoint(ctx, dir, again); err != nil {
		t.Fatal(err)
	}
	trainSteps(t, again, params, 8, 3)
	if d := after.diff(gatherStateOf(t, again, params)); d != "" {
		t.Fatalf("resumed training differs from the original: %s", d)
	}
	for _, rt := range rts {
		if err := rt.Close(); err != nil {
			t.Fatalf("closing a rank after the save: %v", err)
		}
	}
}

// writeGate holds every write of an engine until released.
type writeGate struct {
	once sync.Once
	open chan struct{}
}

func (g *writeGate) Before(p aio.PieceInfo) aio.Fault {
	if p.Op == aio.OpWrite {
		<-g.open
	}
	return aio.Fault{}
}

func (g *writeGate) release() { g.once.Do(func() { close(g.open) }) }

// BenchmarkAsyncStallPinned measures how long SaveCheckpointAsync holds the
// training loop when all of a runtime's state is in pinned memory
// (CPU-tier bf16 parameters, optimizer states in memory), against the time
// SaveCheckpoint takes, in interleaved rounds on one directory (default
// /var/tmp, ZINF_BENCH_DIR), alternating which goes first. The checkpoint is
// about ZINF_BENCH_BYTES bytes (default 2 GiB; 14 bytes per parameter
// element: bf16 param + fp32 master, exp_avg, exp_avg_sq), the rounds
// ZINF_BENCH_ROUNDS (default 3). A third variant, copy-async, saves the
// same tensors as plain FromFunc sources, which SaveAsync copies into its
// snapshot (what it did before the pinned-memory states were
// copy-on-write). Run it with -benchtime=1x; medians are reported as
// metrics (seconds) and logged per round.
func BenchmarkAsyncStallPinned(b *testing.B) {
	if testing.Short() {
		b.Skip("allocates gigabytes and writes them to disk; skipped under -short")
	}
	total := envInt64(b, "ZINF_BENCH_BYTES", 2<<30)
	rounds := int(envInt64(b, "ZINF_BENCH_ROUNDS", 3))
	base := os.Getenv("ZINF_BENCH_DIR")
	if base == "" {
		base = "/var/tmp"
	}
	root, err := os.MkdirTemp(base, "zinf-bench-stall-")
	if err != nil {
		b.Fatal(err)
	}
	defer os.RemoveAll(root)
	ctx := context.Background()

	const perTensor = 32 << 20 // elements
	elems := total / 14
	cfg := config.Default()
	cfg.SetScratchDir(root)
	cfg.BF16 = true
	cfg.ZeroOptimization.OffloadParam.Device = config.OffloadCPU
	cfg.ZeroOptimization.OffloadOptimizer.Device = config.OffloadCPU
	cfg.ZeroOptimization.SubGroupSize = 8 << 20
	// Params (2 bytes, twice while a step stages them), both optimizer
	// record copies (24), gradients (4) and a step's gradient and master
	// buffers, plus slack.
	cfg.Zinf.Tiers.CPUPinnedBytes = config.Size(elems*36 + 1<<30)
	var model Model
	for n := int64(0); n < elems; n += perTensor {
		i := len(model.Tensors)
		model.Tensors = append(model.Tensors, tensor.Desc{Name: fmt.Sprintf("layer%02d.w", i), Shape: []int{int(min(perTensor, elems-n))}, Layer: i})
	}
	rt, err := Open(cfg, model, Options{Logger: quietLog})
	if err != nil {
		b.Fatal(err)
	}
	defer rt.Close()
	for _, d := range model.Tensors {
		master := make([]float32, d.Shape[0])
		for j := range master {
			master[j] = float32(j%1000)/1000 - 0.5
		}
		if err := rt.Init(ctx, d.Name, master); err != nil {
			b.Fatal(err)
		}
	}
	rts := []*Runtime{rt}
	meta := CheckpointMeta{Step: 1}
	opts := checkpoint.SaveOptions{Logger: quietLog}
	s := checkpoint.NewSaver(checkpoint.SaverOptions{Logger: quietLog})
	defer s.Close()
	seq := 0
	dirOf := func() string { seq++; return filepath.Join(root, fmt.Sprintf("ckpt-%03d", seq)) }
	saveSync := func() float64 {
		dir := dirOf()
		t0 := time.Now()
		if _, err := SaveCheckpoint(ctx, dir, rts, meta, opts); err != nil {
			b.Fatal(err)
		}
		d := time.Since(t0).Seconds()
		os.RemoveAll(dir)
		return d
	}
	// saveAsync returns how long the caller was held; copy makes every
	// tensor a FromFunc over the same source, which SaveAsync copies.
	saveAsync := func(copy bool) float64 {
		dir := dirOf()
		t0 := time.Now()
		var h *checkpoint.Handle
		var err error
		if copy {
			var st checkpoint.State
			if st, err = CheckpointState(rts, meta); err == nil {
				for _, r := range st.Ranks {
					for _, f := range r.Files {
						for i, t := range f.Tensors {
							f.Tensors[i] = checkpoint.FromFunc(t.Name, t.DType, t.Shape, t.Bytes, t.Read)
						}
					}
				}
				h, err = s.SaveAsync(ctx, dir, st, opts)
			}
		} else {
			h, err = SaveCheckpointAsync(ctx, s, dir, rts, meta, opts)
		}
		if err != nil {
			b.Fatal(err)
		}
		stall := time.Since(t0).Seconds()
		if _, err := h.Wait(); err != nil {
			b.Fatal(err)
		}
		os.RemoveAll(dir)
		return stall
	}
	// Warm-up, untimed: the Saver maps its snapshot pool, every page of the
	// runtime's state is touched.
	saveAsync(false)
	saveSync()
	b.Logf("state: %d elements in %d tensors; checkpoint %.2f GiB; dir %s", elems, (elems+perTensor-1)/perTensor, float64(elems*14)/(1<<30), base)

	var syncs, stalls, copies []float64
	for b.Loop() {
		for r := range rounds {
			var sy, st, cp float64
			if r%2 == 0 {
				sy, st, cp = saveSync(), saveAsync(false), saveAsync(true)
			} else {
				cp, st, sy = saveAsync(true), saveAsync(false), saveSync()
			}
			syncs, stalls, copies = append(syncs, sy), append(stalls, st), append(copies, cp)
			b.Logf("round %d: SaveCheckpoint %.3f s; SaveCheckpointAsync held %.6f s (%.3f%%); copying SaveAsync held %.3f s (%.1f%%)",
				r+1, sy, st, 100*st/sy, cp, 100*cp/sy)
		}
	}
	sy, st, cp := median(syncs), median(stalls), median(copies)
	b.Logf("medians of %d rounds: SaveCheckpoint %.3f s; SaveCheckpointAsync held %.6f s = %.3f%%; copying SaveAsync held %.3f s = %.1f%%",
		len(syncs), sy, st, 100*st/sy, cp, 100*cp/sy)
	b.ReportMetric(sy, "save-s")
	b.ReportMetric(st, "stall-s")
	b.ReportMetric(100*st/sy, "stall-%")
	b.ReportMetric(cp, "copy-stall-s")
	b.ReportMetric(100*cp/sy, "copy-stall-%")
	b.ReportMetric(0, "ns/op") // one op is a whole set of rounds: not a useful figure
}

func envInt64(b *testing.B, key string, def int64) int64 {
	v := os.Getenv(key)
	if v == "" {
		return def
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || n <= 0 {
		b.Fatalf("%s=%q: want a positive integer", key, v)
	}
	return n
}

func median(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	if len(s) == 0 {
		return 0
	}
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

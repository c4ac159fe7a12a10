package zinf

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"math/rand/v2"
	"path/filepath"
	"strings"
	"testing"

	"github.com/zinfio/zinf/checkpoint"
	"github.com/zinfio/zinf/config"
	"github.com/zinfio/zinf/swapper"
)

var quietLog = slog.New(slog.NewTextHandler(io.Discard, nil))

// ckptParams are the test model: odd sizes, so partitions are uneven, on
// both param tiers.
var ckptParams = []struct {
	name  string
	numel int
	tier  swapper.Tier
}{
	{"embed", 1001, swapper.TierNVMe},
	{"block.0.w", 640, swapper.TierCPU},
	{"block.0.b", 13, swapper.TierNVMe},
}

// openRanks opens world runtimes with their own swap directories and
// registers ckptParams with values from seed.
func openRanks(t *testing.T, world int, dt swapper.DType, seed uint64, mutate ...func(*config.Config)) []*Runtime {
	t.Helper()
	cfg := config.Default()
	cfg.SetScratchDir(t.TempDir())
	cfg.Zinf.Tiers.CPUPinnedBytes = 16 << 20
	cfg.ZeroOptimization.SubGroupSize = 300 // several sub-groups per partition
	cfg.BF16 = dt == swapper.BFloat16
	cfg.FP16 = dt == swapper.Float16
	for _, m := range mutate {
		m(cfg)
	}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	var rts []*Runtime
	for r := range world {
		rt, err := Open(cfg, Options{Logger: quietLog, Rank: r, WorldSize: world})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { rt.Close() })
		rts = append(rts, rt)
	}
	rng := rand.New(rand.NewPCG(seed, 1))
	for _, p := range ckptParams {
		master := make([]float32, p.numel)
		for i := range master {
			master[i] = rng.Float32()*2 - 1
		}
		for _, rt := range rts {
			if err := rt.RegisterParam(context.Background(), p.name, p.tier, master); err != nil {
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
	ctx := context.Background()
	out := fullState{step: rts[0].Optimizer.StepCount(), t: map[string][]float32{}}
	for _, p := range ckptParams {
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

package zinf_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/zinfio/zinf"
	"github.com/zinfio/zinf/checkpoint"
	"github.com/zinfio/zinf/config"
	"github.com/zinfio/zinf/tensor"
)

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// resumeModel has odd sizes, so that every world size partitions it
// unevenly, and a tensor smaller than some world sizes.
var resumeModel = zinf.LayeredModel(
	[]tensor.Desc{{Name: "embed", Shape: []int{7, 143}}},
	[]tensor.Desc{{Name: "block.w", Shape: []int{640}}, {Name: "block.b", Shape: []int{3}}},
	[]tensor.Desc{{Name: "head", Shape: []int{257}}},
)

// openJob opens world runtimes (ranks of one job simulated in one
// process) on a tight pinned budget, every parameter and optimizer state
// on NVMe, and gives every parameter its initial values.
func openJob(t *testing.T, world int) []*zinf.Runtime {
	t.Helper()
	cfg := config.Default()
	cfg.SetScratchDir(t.TempDir())
	cfg.Zinf.Tiers.CPUPinnedBytes = 8 << 20
	cfg.ZeroOptimization.OffloadParam.MaxInCPU = 0
	cfg.ZeroOptimization.SubGroupSize = 100
	cfg.BF16 = true
	var rts []*zinf.Runtime
	for r := range world {
		rt, err := zinf.Open(cfg, resumeModel, zinf.Options{Rank: r, WorldSize: world, Logger: quiet})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { rt.Close() })
		rts = append(rts, rt)
	}
	ctx := context.Background()
	for _, d := range resumeModel.Tensors {
		v := make([]float32, numelOf(d.Name))
		for i := range v {
			v[i] = float32(math.Sin(float64(i)+float64(len(d.Name)))) * 0.1
		}
		for _, rt := range rts {
			if err := rt.Init(ctx, d.Name, v); err != nil {
				t.Fatal(err)
			}
		}
	}
	return rts
}

// trainJob runs steps from..to-1 on every rank. The gradient of a step
// depends on the parameters read in it and on the step index (the data),
// so a resume that restored either wrongly drifts. after is called after
// each step with the number of steps done.
func trainJob(t *testing.T, rts []*zinf.Runtime, from, to int, after func(done int)) {
	t.Helper()
	ctx := context.Background()
	params := map[string][]float32{}
	for _, d := range resumeModel.Tensors {
		params[d.Name] = make([]float32, numelOf(d.Name))
	}
	for step := from; step < to; step++ {
		for _, rt := range rts {
			rt.Forward()
		}
		for l := range rts[0].Layers() {
			for _, rt := range rts {
				if err := rt.BeginLayer(ctx, l); err != nil {
					t.Fatal(err)
				}
				for _, name := range rt.LayerTensors(l) {
					if err := rt.ReadParam(ctx, name, params[name]); err != nil { // this rank's partition
						t.Fatal(err)
					}
				}
				rt.EndLayer(l)
			}
		}
		for _, rt := range rts {
			rt.Backward()
		}
		for l := rts[0].Layers() - 1; l >= 0; l-- {
			for _, rt := range rts {
				if err := rt.BeginLayer(ctx, l); err != nil {
					t.Fatal(err)
				}
				for _, name := range rt.LayerTensors(l) {
					p := params[name]
					g := make([]float32, len(p))
					for i := range g {
						g[i] = 0.5*p[i] + float32(math.Cos(float64(step*31+i)))*0.01
					}
					if err := rt.AccumulateGrad(ctx, name, g); err != nil {
						t.Fatal(err)
					}
				}
				rt.EndLayer(l)
			}
		}
		for _, rt := range rts {
			if err := rt.Step(ctx); err != nil {
				t.Fatal(err)
			}
		}
		if after != nil {
			after(step + 1)
		}
	}
}

func numelOf(name string) int {
	for _, d := range resumeModel.Tensors {
		if d.Name == name {
			n, _ := d.Numel()
			return int(n)
		}
	}
	panic("no tensor " + name)
}

// jobState is every parameter's compute values and fp32 optimizer
// states, gathered whole from the ranks.
type jobState map[string][4][]float32

func stateOf(t *testing.T, rts []*zinf.Runtime) jobState {
	t.Helper()
	ctx := context.Background()
	out := jobState{}
	for l := range rts[0].Layers() {
		for _, rt := range rts {
			if err := rt.BeginLayer(ctx, l); err != nil {
				t.Fatal(err)
			}
		}
		for _, name := range rts[0].LayerTensors(l) {
			n := numelOf(name)
			var s [4][]float32
			for k := range s {
				s[k] = make([]float32, n)
			}
			for _, rt := range rts {
				if err := rt.ReadParam(ctx, name, s[0]); err != nil {
					t.Fatal(err)
				}
				lo, hi := rt.Partition(name)
				if lo == hi {
					continue
				}
				m, a, v, err := rt.ReadOptimizerState(ctx, name)
				if err != nil {
					t.Fatal(err)
				}
				copy(s[1][lo:hi], m)
				copy(s[2][lo:hi], a)
				copy(s[3][lo:hi], v)
			}
			out[name] = s
		}
		for _, rt := range rts {
			rt.EndLayer(l)
		}
	}
	return out
}

// diff names the first element where a and b differ in their bits.
func (a jobState) diff(b jobState) string {
	for name, sa := range a {
		sb := b[name]
		for k, what := range []string{"param", "master", "exp_avg", "exp_avg_sq"} {
			if len(sa[k]) != len(sb[k]) {
				return fmt.Sprintf("%s %s: %d vs %d elements", name, what, len(sa[k]), len(sb[k]))
			}
			for i := range sa[k] {
				if math.Float32bits(sa[k][i]) != math.Float32bits(sb[k][i]) {
					return fmt.Sprintf("%s %s element %d: %v vs %v", name, what, i, sa[k][i], sb[k][i])
				}
			}
		}
	}
	return ""
}

// TestCheckpointerResume is how a Go training loop gets crash safety: a
// Checkpointer saves every 2 steps into a root it shares with a user's
// files and an unrelated checkpoint, keeping the newest 2 of its own; a
// job "crashes" after step 5 (its runtimes are dropped); a new job at
// another world size finds the newest committed checkpoint with
// ResumeLatest and trains to the end. Its final weights and optimizer
// states must equal an uninterrupted job's bit for bit, and retention
// must have touched nothing it did not make.
func TestCheckpointerResume(t *testing.T) {
	for _, c := range []struct {
		name     string
		from, to int
		async    bool
	}{{"world2-to-3-sync", 2, 3, false}, {"world1-to-2-async", 1, 2, true}} {
		t.Run(c.name, func(t *testing.T) {
			const total = 7
			ctx := context.Background()
			want := func() jobState {
				rts := openJob(t, c.from)
				trainJob(t, rts, 0, total, nil)
				return stateOf(t, rts)
			}()

			root := t.TempDir()
			notes := filepath.Join(root, "notes.txt")
			mine := filepath.Join(root, ".tmp-mywork")
			if err := os.WriteFile(notes, []byte("mine"), 0o644); err != nil {
				t.Fatal(err)
			}
			if err := os.Mkdir(mine, 0o755); err != nil {
				t.Fatal(err)
			}
			// A checkpoint the user saved by hand, of an early step, which
			// retention counting every checkpoint in the root would delete.
			rtsA := openJob(t, c.from)
			best := filepath.Join(root, "best")
			if _, err := zinf.SaveCheckpoint(ctx, best, rtsA, zinf.CheckpointMeta{Step: 1}, checkpoint.SaveOptions{Logger: quiet}); err != nil {
				t.Fatal(err)
			}

			ck, err := zinf.OpenCheckpointer(root, zinf.CheckpointerOptions{Every: 2, KeepLast: 2, Async: c.async, Logger: quiet})
			if err != nil {
				t.Fatal(err)
			}
			if _, err := zinf.OpenCheckpointer(root, zinf.CheckpointerOptions{Every: 2}); err == nil || !strings.Contains(err.Error(), "in use") {
				t.Fatalf("a second checkpointer on the same root: %v", err)
			}
			trainJob(t, rtsA, 0, 5, func(done int) {
				if ck.Due(int64(done)) {
					if err := ck.Save(ctx, rtsA, zinf.CheckpointMeta{Step: int64(done)}); err != nil {
						t.Fatal(err)
					}
				}
			})
			// The crash: the job stops after step 5; its checkpointer's
			// save in flight (async) still commits or not, as a killed
			// process's would not; either way step 4 is the newest that
			// Close reports committed.
			if err := ck.Close(); err != nil {
				t.Fatal(err)
			}
			recs := ck.Records()
			if len(recs) != 2 || recs[0].Step != 2 || recs[1].Step != 4 || recs[1].Dir != filepath.Join(root, zinf.CheckpointName(4)) || recs[1].Bytes <= 0 {
				t.Fatalf("records %+v", recs)
			}

			rtsB := openJob(t, c.to)
			info, meta, err := zinf.ResumeLatest(ctx, root, rtsB)
			if err != nil {
				t.Fatal(err)
			}
			if meta.Step != 4 || info.Name != "step-000004" || info.WorldSize != c.from {
				t.Fatalf("resumed %+v at step %d, want step-000004 of world %d", info, meta.Step, c.from)
			}
			ck2, err := zinf.OpenCheckpointer(root, zinf.CheckpointerOptions{Every: 2, KeepLast: 2, Async: c.async, Logger: quiet})
			if err != nil {
				t.Fatal(err)
			}
			trainJob(t, rtsB, int(meta.Step), total, func(done int) {
				if ck2.Due(int64(done)) || done == total {
					if err := ck2.Save(ctx, rtsB, zinf.CheckpointMeta{Step: int64(done)}); err != nil {
						t.Fatal(err)
					}
				}
			})
			if err := ck2.Close(); err != nil {
				t.Fatal(err)
			}
			if d := want.diff(stateOf(t, rtsB)); d != "" {
				t.Fatalf("resumed at world %d from world %d differs from the uninterrupted job: %s", c.to, c.from, d)
			}

			entries, err := os.ReadDir(root)
			if err != nil {
				t.Fatal(err)
			}
			var names []string
			for _, e := range entries {
				names = append(names, e.Name())
			}
			if wantNames := []string{".tmp-mywork", "best", "notes.txt", "step-000006", "step-000007"}; !slices.Equal(names, wantNames) {
				t.Fatalf("the root holds %v, want %v", names, wantNames)
			}
			if l, err := zinf.LatestCheckpoint(root); err != nil || l.Name != "step-000007" {
				t.Fatalf("LatestCheckpoint = %+v, %v", l, err)
			}
			// The final checkpoint loads into a third job equal to the end.
			rtsC := openJob(t, 1)
			if _, _, err := zinf.ResumeLatest(ctx, root, rtsC); err != nil {
				t.Fatal(err)
			}
			if d := want.diff(stateOf(t, rtsC)); d != "" {
				t.Fatalf("the final checkpoint differs from the uninterrupted job: %s", d)
			}
		})
	}
}

// TestResumeLatestNone: no checkpoint to resume from is an error wrapping
// checkpoint.ErrNoCheckpoint, whether the root is missing, empty or holds
// only a checkpoint a Checkpointer did not name.
func TestResumeLatestNone(t *testing.T) {
	ctx := context.Background()
	rts := openJob(t, 1)
	root := t.TempDir()
	if _, err := zinf.SaveCheckpoint(ctx, filepath.Join(root, "step-7"), rts, zinf.CheckpointMeta{Step: 7}, checkpoint.SaveOptions{Logger: quiet}); err != nil {
		t.Fatal(err)
	}
	if _, err := zinf.SaveCheckpoint(ctx, filepath.Join(root, "step-000008"), rts, zinf.CheckpointMeta{Step: 9}, checkpoint.SaveOptions{Logger: quiet}); err != nil {
		t.Fatal(err)
	}
	for _, r := range []string{filepath.Join(t.TempDir(), "missing"), t.TempDir(), root} {
		if _, _, err := zinf.ResumeLatest(ctx, r, rts); !errors.Is(err, checkpoint.ErrNoCheckpoint) {
			t.Errorf("ResumeLatest(%s) = %v, want ErrNoCheckpoint", r, err)
		}
	}
}

// TestLatestCheckpointDamaged: a damaged checkpoint.json in the newest
// checkpoint stops LatestCheckpoint and ResumeLatest with an error naming
// the directory and what is wrong (wrapping checkpoint.ErrCorrupt), whether
// an older checkpoint is there or not; it used to pass over it for the
// older one silently, or say "no committed checkpoint" when it was the
// only one. A damaged checkpoint older than a good one is no obstacle.
func TestLatestCheckpointDamaged(t *testing.T) {
	ctx := context.Background()
	rts := openJob(t, 1)
	root := t.TempDir()
	for _, step := range []int64{1, 2, 3} {
		if _, err := zinf.SaveCheckpoint(ctx, filepath.Join(root, zinf.CheckpointName(step)), rts, zinf.CheckpointMeta{Step: step}, checkpoint.SaveOptions{Logger: quiet}); err != nil {
			t.Fatal(err)
		}
	}
	damage := func(step int64) string {
		dir := filepath.Join(root, zinf.CheckpointName(step))
		if err := os.WriteFile(filepath.Join(dir, "checkpoint.json"), []byte("{\"format\": garbage"), 0o644); err != nil {
			t.Fatal(err)
		}
		return dir
	}
	bad := damage(3)
	for _, call := range []func() error{
		func() error { _, err := zinf.LatestCheckpoint(root); return err },
		func() error { _, _, err := zinf.ResumeLatest(ctx, root, rts); return err },
	} {
		err := call()
		if !errors.Is(err, checkpoint.ErrCorrupt) || errors.Is(err, checkpoint.ErrNoCheckpoint) ||
			!strings.Contains(err.Error(), bad) || !strings.Contains(err.Error(), "checkpoint.json") || !strings.Contains(err.Error(), "step-000002") {
			t.Fatalf("a damaged newest checkpoint: %v, want ErrCorrupt naming %s, its checkpoint.json and the older step-000002", err, bad)
		}
	}
	// The older one is still loaded by name.
	if _, err := zinf.LoadCheckpoint(ctx, filepath.Join(root, "step-000002"), rts); err != nil {
		t.Fatal(err)
	}
	// The only checkpoint damaged: not "no committed checkpoint".
	only := t.TempDir()
	if _, err := zinf.SaveCheckpoint(ctx, filepath.Join(only, zinf.CheckpointName(5)), rts, zinf.CheckpointMeta{Step: 5}, checkpoint.SaveOptions{Logger: quiet}); err != nil {
		t.Fatal(err)
	}
	root = only
	bad = damage(5)
	if _, err := zinf.LatestCheckpoint(only); !errors.Is(err, checkpoint.ErrCorrupt) || errors.Is(err, checkpoint.ErrNoCheckpoint) || !strings.Contains(err.Error(), bad) {
		t.Fatalf("the only checkpoint damaged: %v, want ErrCorrupt naming %s", err, bad)
	}
	// An older damaged one under a good newest: the newest is returned.
	root = t.TempDir()
	for _, step := range []int64{1, 2} {
		if _, err := zinf.SaveCheckpoint(ctx, filepath.Join(root, zinf.CheckpointName(step)), rts, zinf.CheckpointMeta{Step: step}, checkpoint.SaveOptions{Logger: quiet}); err != nil {
			t.Fatal(err)
		}
	}
	damage(1)
	if l, err := zinf.LatestCheckpoint(root); err != nil || l.Step != 2 {
		t.Fatalf("LatestCheckpoint = %+v, %v; want step 2", l, err)
	}
}

// TestCheckpointerOptions: bad options are refused, each named, before
// the root is created.
func TestCheckpointerOptions(t *testing.T) {
	root := filepath.Join(t.TempDir(), "ck")
	_, err := zinf.OpenCheckpointer(root, zinf.CheckpointerOptions{Every: 0, KeepLast: -2, Save: checkpoint.SaveOptions{Overwrite: true}})
	if err == nil {
		t.Fatal("accepted")
	}
	for _, want := range []string{"Every 0", "KeepLast -2", "Overwrite"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error lacks %q: %v", want, err)
		}
	}
	if _, err := os.Stat(root); !os.IsNotExist(err) {
		t.Fatalf("a refused checkpointer created its root: %v", err)
	}
	file := filepath.Join(t.TempDir(), "file")
	os.WriteFile(file, nil, 0o644)
	if _, err := zinf.OpenCheckpointer(file, zinf.CheckpointerOptions{Every: 1}); err == nil {
		t.Fatal("a file accepted as the root")
	}
	if zinf.CheckpointName(12) != "step-000012" || zinf.CheckpointName(12345678) != "step-12345678" {
		t.Fatalf("CheckpointName: %s %s", zinf.CheckpointName(12), zinf.CheckpointName(12345678))
	}
}

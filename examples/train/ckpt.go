package train

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"

	"github.com/zinfio/zinf"
	"github.com/zinfio/zinf/checkpoint"
	"github.com/zinfio/zinf/swapper/optimizer"
)

// ModelShape returns the model's full parameter shapes: each layer's
// weight is Width x Width (out x in), its bias Width. Checkpoints record
// it, and a resume checks it.
func (s Spec) ModelShape() map[string][]int64 {
	out := make(map[string][]int64, 2*s.Layers)
	for l := 0; l < s.Layers; l++ {
		out[WeightName(l)] = []int64{int64(s.Width), int64(s.Width)}
		out[BiasName(l)] = []int64{int64(s.Width)}
	}
	return out
}

// runMetaKey is the checkpoint metadata key of runMeta.
const runMetaKey = "train.run"

// runMeta is what a checkpoint records of the run that took it beyond
// the tensors: everything the rest of the run's arithmetic depends on.
// A resume continues the data stream where the checkpoint left it (step
// index, the same micro-batches of the same data-parallel ranks), which
// is only the same stream with the same seed, batch and ranks; and the
// same trajectory only with the same micro-steps and optimizer. The world
// size of the runtimes is not here: it only partitions the tensors.
type runMeta struct {
	Layers int    `json:"layers"`
	Width  int    `json:"width"`
	Batch  int    `json:"batch"`
	Seed   uint64 `json:"seed"`
	DType  string `json:"dtype"`
	// Micro is gradient_accumulation_steps.
	Micro int `json:"micro_steps"`
	// DataParallel is the number of data-parallel ranks whose
	// micro-batches make a step's gradient: the world size of the run that
	// started the job. A run resumed at another world size keeps it (the
	// global batch), so that only the partitioning changes.
	DataParallel int             `json:"data_parallel"`
	Hyper        optimizer.Hyper `json:"adam"`
}

func (m runMeta) encode() string {
	b, _ := json.Marshal(m) // plain numbers and strings: cannot fail
	return string(b)
}

// check reports every way the run o differs from the checkpoint's run m,
// naming the flag or config key.
func (m runMeta) check(o runMeta) error {
	var errs []error
	diff := func(what string, saved, now any) {
		errs = append(errs, fmt.Errorf("%s is %v in the checkpoint, %v in this run", what, saved, now))
	}
	if m.Layers != o.Layers {
		diff("the layer count (zinf train --layers)", m.Layers, o.Layers)
	}
	if m.Width != o.Width {
		diff("the layer width (zinf train --width)", m.Width, o.Width)
	}
	if m.Batch != o.Batch {
		diff("the micro-batch rows (zinf train --batch)", m.Batch, o.Batch)
	}
	if m.Seed != o.Seed {
		diff("the seed (zinf train --seed)", m.Seed, o.Seed)
	}
	if m.DType != o.DType {
		diff("the parameter dtype (config bf16.enabled / fp16.enabled)", m.DType, o.DType)
	}
	if m.Micro != o.Micro {
		diff("gradient_accumulation_steps", m.Micro, o.Micro)
	}
	h, g := m.Hyper, o.Hyper
	for _, f := range []struct {
		key        string
		saved, now float32
	}{{"optimizer.params.lr", h.LR, g.LR}, {"optimizer.params.betas[0]", h.Beta1, g.Beta1}, {"optimizer.params.betas[1]", h.Beta2, g.Beta2},
		{"optimizer.params.eps", h.Eps, g.Eps}, {"optimizer.params.weight_decay", h.WeightDecay, g.WeightDecay}} {
		if math.Float32bits(f.saved) != math.Float32bits(f.now) {
			diff(f.key, f.saved, f.now)
		}
	}
	if h.AdamW != g.AdamW {
		diff("decoupled weight decay (optimizer.type AdamW)", h.AdamW, g.AdamW)
	}
	return errors.Join(errs...)
}

// checkpointMeta describes a checkpoint taken after step steps.
func (b *zinfBackend) checkpointMeta(step int) zinf.CheckpointMeta {
	user := map[string]string{"example": "train", "spec": fmt.Sprintf("%d layers x width %d, seed %d", b.spec.Layers, b.spec.Width, b.spec.Seed)}
	if b.run.Layers > 0 {
		user[runMetaKey] = b.run.encode()
	}
	return zinf.CheckpointMeta{Step: int64(step), ModelShape: b.spec.ModelShape(), User: user}
}

// saveCheckpoint saves every rank's parameters and optimizer states as
// the checkpoint dir, taken after step steps (between steps).
func (b *zinfBackend) saveCheckpoint(ctx context.Context, dir string, step int, opts checkpoint.SaveOptions) (*checkpoint.Manifest, error) {
	return zinf.SaveCheckpoint(ctx, dir, b.rts, b.checkpointMeta(step), opts)
}

// saveCheckpointAsync is saveCheckpoint through s: it returns once the
// snapshot is taken, and training may go on while it drains.
func (b *zinfBackend) saveCheckpointAsync(ctx context.Context, s *checkpoint.Saver, dir string, step int, opts checkpoint.SaveOptions) (*checkpoint.Handle, error) {
	return zinf.SaveCheckpointAsync(ctx, s, dir, b.rts, b.checkpointMeta(step), opts)
}

// loadCheckpoint restores the checkpoint dir into the backend's runtimes
// (any world size: zinf.LoadCheckpoint re-partitions) after checking that
// it was taken of this model (its recorded shapes, exactly), and returns
// the step to resume at. On a mismatch nothing is changed.
func (b *zinfBackend) loadCheckpoint(ctx context.Context, dir string) (int, error) {
	r, err := checkpoint.OpenRank(dir, 0)
	if err != nil {
		return 0, err
	}
	err = r.CheckModelShape(b.spec.ModelShape())
	r.Close()
	if err != nil {
		return 0, err
	}
	meta, err := zinf.LoadCheckpoint(ctx, dir, b.rts)
	if err != nil {
		return 0, err
	}
	return int(meta.Step), nil
}

// savedRun reads the run metadata of the checkpoint dir.
func savedRun(dir string) (runMeta, error) {
	r, err := checkpoint.OpenRank(dir, 0)
	if err != nil {
		return runMeta{}, err
	}
	defer r.Close()
	v, ok := r.Meta().User[runMetaKey]
	if !ok {
		return runMeta{}, fmt.Errorf("train: the checkpoint %s was not taken by the training example (no %q metadata): it cannot tell where the data stream stopped", dir, runMetaKey)
	}
	var m runMeta
	if err := json.Unmarshal([]byte(v), &m); err != nil {
		return runMeta{}, fmt.Errorf("train: the checkpoint %s: metadata %q: %w", dir, runMetaKey, err)
	}
	if m.DataParallel < 1 || m.Micro < 1 {
		return runMeta{}, fmt.Errorf("train: the checkpoint %s: metadata %q has data_parallel %d and micro_steps %d; both must be at least 1", dir, runMetaKey, m.DataParallel, m.Micro)
	}
	return m, nil
}

// Resumed is where a run resumed (Result.Resumed).
type Resumed struct {
	// Step is the number of steps the checkpoint had done.
	Step int `json:"step"`
	// Dir is the checkpoint loaded.
	Dir string `json:"dir"`
	// WorldSize is the world size the checkpoint was saved at.
	WorldSize int `json:"world_size"`
	// DataParallel is the data-parallel degree the run keeps (the one the
	// job started with).
	DataParallel int `json:"data_parallel"`
}

// findResume finds the newest committed checkpoint under root and checks
// that it continues run, returning it and the run to continue (run with
// the checkpoint's data-parallel degree).
func findResume(root string, run runMeta) (checkpoint.Info, runMeta, error) {
	info, err := zinf.LatestCheckpoint(root)
	if errors.Is(err, checkpoint.ErrNoCheckpoint) {
		return info, run, fmt.Errorf("train: no committed checkpoint in %s to resume from: %w", root, err)
	}
	if err != nil {
		return info, run, err
	}
	return continueFrom(info, run)
}

// continueFrom checks that the checkpoint info continues run, returning
// the run to continue (run with the checkpoint's data-parallel degree).
func continueFrom(info checkpoint.Info, run runMeta) (checkpoint.Info, runMeta, error) {
	saved, err := savedRun(info.Dir)
	if err != nil {
		return info, run, err
	}
	run.DataParallel = saved.DataParallel
	if err := saved.check(run); err != nil {
		return info, run, fmt.Errorf("train: the checkpoint %s is of another run; resume with the flags and config it was taken with:\n%w", info.Dir, err)
	}
	return info, run, nil
}

// resumeFrom checks the committed checkpoint dir, named to resume from
// (Options.ResumeFrom), and that root, where the resumed run saves, holds
// no checkpoint directory after it (it would save over it), and returns
// it with the run to continue.
func resumeFrom(dir, root string, run runMeta) (checkpoint.Info, runMeta, error) {
	m, err := checkpoint.ReadManifest(dir)
	if err != nil {
		return checkpoint.Info{}, run, fmt.Errorf("train: cannot resume from %s (--resume-from): %w", dir, err)
	}
	info := checkpoint.Info{Name: filepath.Base(filepath.Clean(dir)), Dir: dir, Step: m.Step, WorldSize: m.WorldSize, Created: m.Created}
	entries, err := os.ReadDir(root)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return info, run, fmt.Errorf("train: the checkpoint directory %s: %w", root, err)
	}
	var later []string
	for _, e := range entries {
		step := int64(-1)
		if _, err := fmt.Sscanf(e.Name(), "step-%d", &step); err == nil && e.Name() == zinf.CheckpointName(step) && step > m.Step {
			later = append(later, e.Name())
		}
	}
	if len(later) > 0 {
		return info, run, fmt.Errorf("train: the checkpoint directory %s holds %s, after step %d of %s resumed from: the resumed run would save over them (a checkpoint is never replaced); move them out of %s or save into another directory (--checkpoint-dir)",
			root, strings.Join(later, ", "), m.Step, dir, root)
	}
	return continueFrom(info, run)
}

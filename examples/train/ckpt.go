package train

import (
	"context"
	"fmt"

	"github.com/zinfio/zinf"
	"github.com/zinfio/zinf/checkpoint"
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

// checkpointMeta describes a checkpoint taken after step steps.
func (b *zinfBackend) checkpointMeta(step int) zinf.CheckpointMeta {
	return zinf.CheckpointMeta{Step: int64(step), ModelShape: b.spec.ModelShape(),
		User: map[string]string{"example": "train", "spec": fmt.Sprintf("%d layers x width %d, seed %d", b.spec.Layers, b.spec.Width, b.spec.Seed)}}
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

package zgomlx_test

import (
	"errors"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gomlx/compute/dtypes"
	"github.com/gomlx/compute/shapes"

	"github.com/zinfio/zinf/checkpoint"
	zgomlx "github.com/zinfio/zinf/contrib/gomlx"
)

// TestCheckpointResume saves a transformer's training after two steps,
// trains two more, then loads the checkpoint into a fresh Offload of the
// same model (registered with different initial values) and trains the
// same two steps again: the same bits. The checkpoint records every
// variable's full shape and GoMLX dtype, and refuses a model whose shapes
// differ, naming the variable, before changing anything.
func TestCheckpointResume(t *testing.T) {
	for _, dt := range []dtypes.DType{dtypes.Float32, dtypes.BFloat16} {
		t.Run(dt.String(), func(t *testing.T) {
			ctx := watchdog(t, 3*time.Minute)
			noFusionForHalf(t, t.Name())
			tc := lmCase(dt, 2)
			b := backend(t)
			cfg := testConfig(t, 8<<20)
			cfg.BF16 = tc.bf16
			tr, err := zgomlx.Create(ctx, b, cfg, newStore(t, b, tc.net, tc.x, 21), tc.net, zgomlx.Options{})
			if err != nil {
				t.Fatal(err)
			}
			defer tr.Close()
			train := func(tr *zgomlx.Trainer, from, to int) []float32 {
				t.Helper()
				var losses []float32
				for i := from; i < to; i++ {
					x, y := tc.batch(i)
					l, err := tr.Step(ctx, x, y)
					if err != nil {
						t.Fatalf("step %d: %v", i, err)
					}
					losses = append(losses, l)
				}
				return losses
			}
			train(tr, 0, 2)
			dir := filepath.Join(t.TempDir(), "step-2")
			off := tr.Offload()
			if _, err := off.SaveCheckpoint(ctx, dir, 2, checkpoint.SaveOptions{}); err != nil {
				t.Fatal(err)
			}
			want := train(tr, 2, 4)
			wantVals := map[string][]byte{}
			for _, v := range off.Vars() {
				got, err := off.ReadVariable(ctx, v.Name)
				if err != nil {
					t.Fatal(err)
				}
				wantVals[v.Name] = valueBytes(t, got)
			}
			// The checkpoint's metadata.
			r, err := checkpoint.OpenRank(dir, 0)
			if err != nil {
				t.Fatal(err)
			}
			meta := r.Meta()
			r.Close()
			for _, v := range off.Vars() {
				dims := make([]int64, len(v.Shape.Dimensions))
				for i, d := range v.Shape.Dimensions {
					dims[i] = int64(d)
				}
				if !slices.Equal(meta.ModelShape[v.Name], dims) {
					t.Errorf("%s: checkpoint shape %v, variable %v", v.Name, meta.ModelShape[v.Name], dims)
				}
				if !strings.Contains(meta.User[zgomlx.MetaDTypes], `"`+v.Name+`":"`+dt.String()+`"`) {
					t.Errorf("%s: dtype %s not recorded in %s", v.Name, dt, meta.User[zgomlx.MetaDTypes])
				}
			}
			// Resume into a fresh model.
			cfg2 := testConfig(t, 8<<20)
			cfg2.BF16 = tc.bf16
			tr2, err := zgomlx.Create(ctx, b, cfg2, newStore(t, b, tc.net, tc.x, 99), tc.net, zgomlx.Options{})
			if err != nil {
				t.Fatal(err)
			}
			defer tr2.Close()
			train(tr2, 0, 1) // swap-in buffers now hold values the load must replace
			step, err := tr2.Offload().LoadCheckpoint(ctx, dir)
			if err != nil || step != 2 {
				t.Fatalf("load: step %d, %v", step, err)
			}
			got := train(tr2, 2, 4)
			if !slices.Equal(got, want) {
				t.Fatalf("losses after resuming %v, without stopping %v", got, want)
			}
			for name, w := range wantVals {
				v, err := tr2.Offload().ReadVariable(ctx, name)
				if err != nil {
					t.Fatal(err)
				}
				sameBytes(t, name+" after resuming", valueBytes(t, v), w)
			}
			// A model of another shape is refused by variable.
			other := lmNet(29, 8, 24, 2, 2, dt)
			cfg3 := testConfig(t, 8<<20)
			cfg3.BF16 = tc.bf16
			tr3, err := zgomlx.Create(ctx, b, cfg3, newStore(t, b, other, shapes.Make(dtypes.Int32, 4, 8), 1), other, zgomlx.Options{})
			if err != nil {
				t.Fatal(err)
			}
			defer tr3.Close()
			before, err := tr3.Offload().ReadVariable(ctx, "/head/out/dense/weights")
			if err != nil {
				t.Fatal(err)
			}
			_, err = tr3.Offload().LoadCheckpoint(ctx, dir)
			if !errors.Is(err, checkpoint.ErrShape) || !strings.Contains(err.Error(), "/block_0/") && !strings.Contains(err.Error(), "/embed/") && !strings.Contains(err.Error(), "/head/") {
				t.Fatalf("loading into another model: %v", err)
			}
			after, err := tr3.Offload().ReadVariable(ctx, "/head/out/dense/weights")
			if err != nil {
				t.Fatal(err)
			}
			sameBytes(t, "a refused load", valueBytes(t, after), valueBytes(t, before))
		})
	}
}

package zgomlx_test

import (
	"fmt"
	"runtime"
	"testing"

	"github.com/gomlx/compute/dtypes"
	"github.com/gomlx/compute/shapes"
	"github.com/gomlx/gomlx/core/tensors"

	"github.com/zinfio/zinf/config"
	zgomlx "github.com/zinfio/zinf/contrib/gomlx"
	"github.com/zinfio/zinf/contrib/gomlx/reference"
)

// BenchmarkStep times one training step of a small transformer offloaded
// (params and Adam states on NVMe) and in memory with the same per-layer
// executors, reporting allocations and GC cycles per step; compare the
// two with benchstat, or run the example's --bench for interleaved
// medians.
func BenchmarkStep(b *testing.B) {
	net := lmNet(64, 32, 64, 4, 6, dtypes.Float32)
	for _, mode := range []string{"memory", "offloaded"} {
		b.Run(mode, func(b *testing.B) {
			ctx := b.Context()
			be := backend(b)
			const vocab, seq, batch = 64, 32, 8
			store := newStore(b, be, net, shapes.Make(dtypes.Int32, batch, seq), 1)
			cfg := testConfig(b, 16<<20)
			var step func(i int) error
			switch mode {
			case "memory":
				mt, err := reference.NewMemoryTrainer(be, store, net, cfg, zgomlx.Options{})
				if err != nil {
					b.Fatal(err)
				}
				defer mt.Close()
				step = func(i int) error { x, y := lmBatch(i, batch, seq, vocab); _, err := mt.Step(ctx, x, y); return err }
			default:
				tr, err := zgomlx.Create(ctx, be, cfg, store, net, zgomlx.Options{})
				if err != nil {
					b.Fatal(err)
				}
				defer tr.Close()
				step = func(i int) error { x, y := lmBatch(i, batch, seq, vocab); _, err := tr.Step(ctx, x, y); return err }
			}
			for i := range 2 { // compile and warm the buffers
				if err := step(i); err != nil {
					b.Fatal(err)
				}
			}
			var ms0, ms1 runtime.MemStats
			runtime.ReadMemStats(&ms0)
			b.ResetTimer()
			for i := 0; b.Loop(); i++ {
				if err := step(i); err != nil {
					b.Fatal(err)
				}
			}
			b.StopTimer()
			runtime.ReadMemStats(&ms1)
			b.ReportMetric(float64(ms1.NumGC-ms0.NumGC)/float64(b.N), "gc/op")
			b.ReportMetric(float64(ms1.Mallocs-ms0.Mallocs)/float64(b.N), "mallocs/op")
		})
	}
}

// BenchmarkStepMicroBatches times a step of k micro-batches offloaded,
// layer-major and micro-batch-major (StepMicroBatches under each
// zinf.schedule), and reports the NVMe parameter bytes a step reads (flat
// in k layer-major, about k-fold micro-batch-major) and the activation
// tier's entries: a small transformer (compute-bound on the pure-Go
// backend) and an MLP of eight 512 x 512 layers at batch 2 (little compute for
// its parameter I/O). Each run of the
// benchmark is one round of every case; run it several times for
// interleaved rounds.
func BenchmarkStepMicroBatches(b *testing.B) {
	type model struct {
		name  string
		net   zgomlx.Net
		x     shapes.Shape
		pool  int64
		batch func(i int) (x, y *tensors.Tensor)
	}
	const vocab, seq, batch = 64, 32, 8
	wide := make([]int, 8)
	for i := range wide {
		wide[i] = 512
	}
	models := []model{
		{"lm", lmNet(64, 32, 64, 4, 6, dtypes.Float32), shapes.Make(dtypes.Int32, batch, seq), 16 << 20,
			func(i int) (x, y *tensors.Tensor) { return lmBatch(i, batch, seq, vocab) }},
		{"mlp-512x8", mlpNet(wide...), shapes.Make(dtypes.Float32, 2, 512), 32 << 20,
			func(i int) (x, y *tensors.Tensor) { return mlpBatch(i, 2, 512, 512) }},
	}
	for _, md := range models {
		for _, k := range []int{1, 4} {
			for _, sched := range []config.ScheduleMode{config.ScheduleLayerMajor, config.ScheduleMicroBatchMajor} {
				b.Run(fmt.Sprintf("%s/k=%d/%s", md.name, k, sched), func(b *testing.B) {
					ctx := b.Context()
					be := backend(b)
					store := newStore(b, be, md.net, md.x, 1)
					cfg := testConfig(b, md.pool)
					cfg.GradientAccumulationSteps = k
					cfg.Zinf.Schedule = sched
					cfg.ZeroOptimization.SubGroupSize = 262_144 // the optimizer's pipeline in 1 MiB sub-groups
					tr, err := zgomlx.Create(ctx, be, cfg, store, md.net, zgomlx.Options{})
					if err != nil {
						b.Fatal(err)
					}
					defer tr.Close()
					step := func(i int) error {
						mbs := make([]zgomlx.MicroBatch, k)
						for m := range mbs {
							x, y := md.batch(i*k + m)
							mbs[m] = zgomlx.MicroBatch{Inputs: []*tensors.Tensor{x}, Labels: []*tensors.Tensor{y}}
						}
						_, err := tr.StepMicroBatches(ctx, mbs)
						return err
					}
					if err := step(0); err != nil { // compile and warm the buffers
						b.Fatal(err)
					}
					rt := tr.Offload().Runtime()
					p0, a0 := rt.Metrics().Params.BytesRead, tr.ActivationStats()
					b.ResetTimer()
					n := 0
					for i := 1; b.Loop(); i++ {
						if err := step(i); err != nil {
							b.Fatal(err)
						}
						n++
					}
					b.StopTimer()
					a1 := tr.ActivationStats()
					b.ReportMetric(float64(rt.Metrics().Params.BytesRead-p0)/float64(n), "param-B/op")
					b.ReportMetric(float64(a1.Saved-a0.Saved)/float64(n), "act-entries/op")
					b.ReportMetric(float64(b.Elapsed().Microseconds())/1e3/float64(n*k), "ms/micro-batch")
				})
			}
		}
	}
}

package zgomlx_test

import (
	"runtime"
	"testing"

	"github.com/gomlx/compute/dtypes"
	"github.com/gomlx/compute/shapes"

	zgomlx "github.com/zinfio/zinf/contrib/gomlx"
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
				mt, err := zgomlx.NewMemoryTrainer(be, store, net, cfg, zgomlx.Options{})
				if err != nil {
					b.Fatal(err)
				}
				defer mt.Close()
				step = func(i int) error { x, y := lmBatch(i, batch, seq, vocab); _, err := mt.Step(ctx, x, y); return err }
			default:
				tr, err := zgomlx.Open(ctx, be, cfg, store, net, zgomlx.Options{})
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

package optimizer_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/zinfio/zinf/aio"
	"github.com/zinfio/zinf/swapper/optimizer"
)

// BenchmarkStep measures optimizer state moved per second (bytes read plus
// bytes written, b.SetBytes) by a Step over states on a store in a temp
// directory, without overlap (depth 0) and with a depth-3 pipeline. The
// compute fraction (time in Adam / step time) says how much of the I/O the
// pipeline hid. Under -short the model is 8x smaller.
func BenchmarkStep(b *testing.B) {
	tensors, elems, sg := 8, 1<<19, 1<<18 // 48 MiB of states, 3 MiB sub-groups
	if testing.Short() {
		elems, sg = 1<<16, 1<<15
	}
	specs := make([]spec, tensors)
	for i := range specs {
		specs[i] = spec{fmt.Sprintf("layer%d", i), elems}
	}
	for _, backend := range []string{aio.BackendUring, aio.BackendPosix} {
		for _, depth := range []int{0, 3} {
			b.Run(fmt.Sprintf("%s/depth=%d", backend, depth), func(b *testing.B) {
				r := newRig(b, rigConfig{backend: backend, poolBytes: 64 << 20, specs: specs, seed: 1, noParams: true,
					opts: optimizer.Options{SubGroupSize: sg, PipelineDepth: depth}})
				r.grads.set(r.md.grads(1))
				ctx := context.Background()
				recordBytes := r.opt.Stats().RecordBytes
				b.SetBytes(2 * recordBytes)
				b.ResetTimer()
				for b.Loop() {
					if err := r.opt.Step(ctx); err != nil {
						b.Fatal(err)
					}
				}
				b.StopTimer()
				tot := r.opt.Stats().Total
				if tot.BytesRead+tot.BytesWritten != 2*recordBytes*r.opt.Stats().Steps {
					b.Fatalf("moved %d bytes in %d steps", tot.BytesRead+tot.BytesWritten, r.opt.Stats().Steps)
				}
				b.ReportMetric(float64(tot.Compute)/float64(tot.Elapsed), "compute/elapsed")
				b.ReportMetric(float64(tot.ReadWait)/float64(r.opt.Stats().Steps)/1e6, "readwait-ms/op")
			})
		}
	}
}

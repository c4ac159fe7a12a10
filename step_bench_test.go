package zinf_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/zinfio/zinf"
	"github.com/zinfio/zinf/config"
	"github.com/zinfio/zinf/tensor"
)

// BenchmarkTrainStep is one training step of the README's loop through the
// public API — every layer begun, read, its gradient handed over and its
// update started during backward, then Step — on 12 layers of a 256 x 256
// weight and a bias, everything on NVMe, checksums on. One op is one step;
// allocs/op is what the runtime allocates on the Go heap per step (the
// loop's own buffers are made once), the figure the GoMLX adapter's
// allocation budget rests on.
func BenchmarkTrainStep(b *testing.B) {
	for _, overlap := range []bool{true, false} {
		b.Run(fmt.Sprintf("overlap=%v", overlap), func(b *testing.B) { benchTrainStep(b, overlap, 0) })
	}
}

// BenchmarkTrainStepSplit is BenchmarkTrainStep with sub_group_size 4096:
// every weight is split into 16 optimizer sub-groups, whose new masters
// go to the parameter swapper range by range (allocs/op and B/op show
// whether a step assembles split tensors on the Go heap).
func BenchmarkTrainStepSplit(b *testing.B) {
	for _, overlap := range []bool{true, false} {
		b.Run(fmt.Sprintf("overlap=%v", overlap), func(b *testing.B) { benchTrainStep(b, overlap, 4096) })
	}
}

func benchTrainStep(b *testing.B, overlap bool, subGroup int64) {
	c := config.Default()
	c.SetScratchDir(b.TempDir())
	c.Zinf.Tiers.CPUPinnedBytes = 16 << 20
	if subGroup > 0 {
		c.ZeroOptimization.SubGroupSize = subGroup
	}
	var layers [][]tensor.Desc
	for l := range 12 {
		layers = append(layers, []tensor.Desc{
			{Name: fmt.Sprintf("l%d.w", l), Shape: []int{256, 256}},
			{Name: fmt.Sprintf("l%d.b", l), Shape: []int{256}},
		})
	}
	model := zinf.LayeredModel(layers...)
	rt, err := zinf.Open(c, model, zinf.Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), SerialStep: !overlap, NoBandwidthProbe: true})
	if err != nil {
		b.Fatal(err)
	}
	defer rt.Close()
	ctx := context.Background()
	bufs := map[string][]float32{}
	for _, d := range model.Tensors {
		n, _ := d.Numel()
		v := make([]float32, n)
		for i := range v {
			v[i] = float32(i%97) * 1e-3
		}
		if err := rt.Init(ctx, d.Name, v); err != nil {
			b.Fatal(err)
		}
		bufs[d.Name] = v
	}
	step := func() {
		rt.Forward()
		for l := range rt.Layers() {
			if err := rt.BeginLayer(ctx, l); err != nil {
				b.Fatal(err)
			}
			for _, n := range rt.LayerTensors(l) {
				if err := rt.ReadParam(ctx, n, bufs[n]); err != nil {
					b.Fatal(err)
				}
			}
			rt.EndLayer(l)
		}
		rt.Backward()
		for l := rt.Layers() - 1; l >= 0; l-- {
			if err := rt.BeginLayer(ctx, l); err != nil {
				b.Fatal(err)
			}
			for _, n := range rt.LayerTensors(l) {
				if err := rt.AccumulateGrad(ctx, n, bufs[n]); err != nil {
					b.Fatal(err)
				}
			}
			if err := rt.StepLayer(ctx, l); err != nil {
				b.Fatal(err)
			}
			rt.EndLayer(l)
		}
		if err := rt.Step(ctx); err != nil {
			b.Fatal(err)
		}
	}
	step() // warm up: first writes, pool blocks
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		step()
	}
	b.StopTimer()
	m := rt.Metrics()
	b.ReportMetric(float64(m.BytesRead+m.BytesWritten)/float64(b.N+1), "nvme-B/op")
}

// BenchmarkEmbeddingStep is one training step of a language model's
// embedding as an adapter drives it: a 100000 x 64 fp32 embedding and a
// 64 x 256 layer, everything on NVMe, checksums on; the batch's 512 token
// rows (random, with repeats) are read with ReadParamRows and their
// gradients handed over with AccumulateGradRows (one micro-step), then
// Step. pieces=4MiB streams the embedding (the default), pieces=whole
// moves it whole (Options.PieceBytes -1), both with a pool that holds it
// whole; lookup-read-B/op is what the lookup reads from disk (whole: 0,
// BeginLayer swapped the embedding in), pinned-peak-B the pool's peak.
func BenchmarkEmbeddingStep(b *testing.B) {
	for _, pb := range []int64{0, -1} {
		name := "pieces=4MiB"
		if pb < 0 {
			name = "pieces=whole"
		}
		b.Run(name, func(b *testing.B) {
			c := config.Default()
			c.SetScratchDir(b.TempDir())
			c.Zinf.Tiers.CPUPinnedBytes = 256 << 20
			c.ZeroOptimization.SubGroupSize = 1 << 18
			model := zinf.LayeredModel(
				[]tensor.Desc{{Name: "emb", Shape: []int{100_000, 64}}},
				[]tensor.Desc{{Name: "w", Shape: []int{64, 256}}},
			)
			rt, err := zinf.Open(c, model, zinf.Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), NoBandwidthProbe: true, PieceBytes: pb})
			if err != nil {
				b.Fatal(err)
			}
			defer rt.Close()
			ctx := context.Background()
			for _, d := range model.Tensors {
				n, _ := d.Numel()
				v := make([]float32, n)
				for i := range v {
					v[i] = float32(i%97) * 1e-3
				}
				if err := rt.Init(ctx, d.Name, v); err != nil {
					b.Fatal(err)
				}
			}
			rng := rand.New(rand.NewPCG(1, 2))
			ids := make([]int, 512)
			rowsBuf := make([]byte, 512*64*4)
			w := make([]float32, 64*256)
			var lookupBytes int64 // read from disk by the lookups
			step := func() {
				for i := range ids {
					ids[i] = rng.IntN(100_000)
				}
				rt.Forward()
				for l := range rt.Layers() {
					if err := rt.BeginLayer(ctx, l); err != nil {
						b.Fatal(err)
					}
					if l == 0 {
						before := rt.Engine.Stats().ReadBytes
						if err := rt.ReadParamRows(ctx, "emb", ids, tensor.Float32, rowsBuf); err != nil {
							b.Fatal(err)
						}
						lookupBytes += rt.Engine.Stats().ReadBytes - before
					} else if err := rt.ReadParam(ctx, "w", w); err != nil {
						b.Fatal(err)
					}
					rt.EndLayer(l)
				}
				rt.Backward()
				for l := rt.Layers() - 1; l >= 0; l-- {
					if err := rt.BeginLayer(ctx, l); err != nil {
						b.Fatal(err)
					}
					if l == 0 {
						rows := slices.Compact(slices.Sorted(slices.Values(ids)))
						g := make([]float32, len(rows)*64)
						for i := range g {
							g[i] = 1e-3
						}
						if err := rt.AccumulateGradRows(ctx, "emb", rows, g); err != nil {
							b.Fatal(err)
						}
					} else if err := rt.AccumulateGrad(ctx, "w", w); err != nil {
						b.Fatal(err)
					}
					if err := rt.StepLayer(ctx, l); err != nil {
						b.Fatal(err)
					}
					rt.EndLayer(l)
				}
				if err := rt.Step(ctx); err != nil {
					b.Fatal(err)
				}
			}
			step()
			lookupBytes = 0
			b.ResetTimer()
			for range b.N {
				step()
			}
			b.StopTimer()
			m := rt.Metrics()
			b.ReportMetric(float64(lookupBytes)/float64(b.N), "lookup-read-B/op")
			b.ReportMetric(float64(m.PinnedPeakBytes), "pinned-peak-B")
			b.ReportMetric(float64(m.BytesRead+m.BytesWritten)/float64(b.N+1), "nvme-B/op")
		})
	}
}

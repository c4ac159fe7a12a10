// Command gcm measures the Go garbage collector under offloaded and
// in-memory training (GC cycles, allocations per step) for an MLP and the
// zoo transformer, with and without zgomlx.Options.HeapCredit: one
// configuration per process (see BENCHMARKS.md).
//
//	go run ./examples/gcm -model mlp|lm -mode off|mem -credit none|auto
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math"
	"os"
	"runtime"

	"github.com/gomlx/compute"
	"github.com/gomlx/compute/dtypes"
	_ "github.com/gomlx/compute/gobackend"
	"github.com/gomlx/compute/shapes"
	. "github.com/gomlx/gomlx/core/graph" //nolint:revive
	"github.com/gomlx/gomlx/core/tensors"
	"github.com/gomlx/gomlx/ml/layers"
	"github.com/gomlx/gomlx/ml/model"
	"github.com/gomlx/gomlx/ml/zoo/transformer"

	"github.com/zinfio/zinf/config"
	zgomlx "github.com/zinfio/zinf/contrib/gomlx"
	"github.com/zinfio/zinf/contrib/gomlx/reference"
)

func main() {
	kind := flag.String("model", "mlp", "mlp|lm")
	mode := flag.String("mode", "off", "off|mem")
	credit := flag.String("credit", "none", "none|auto")
	steps := flag.Int("steps", 20, "")
	flag.Parse()
	slog.SetDefault(slog.New(slog.NewTextHandler(io.Discard, nil)))
	ctx := context.Background()
	b, err := compute.NewWithConfig(zgomlx.DefaultBackend)
	if err != nil {
		panic(err)
	}
	var net zgomlx.Net
	var xs shapes.Shape
	var batch func(int) (*tensors.Tensor, *tensors.Tensor)
	store := model.NewStore()
	store.SetParam(model.ParamInitialSeed, int64(1))
	if *kind == "mlp" {
		for i := range 8 {
			last := i == 7
			net.Layers = append(net.Layers, zgomlx.Layer{Scope: fmt.Sprintf("/d%d", i), Fn: func(s *model.Scope, x *Node) *Node {
				y := layers.Dense(s, x, true, 512)
				if last {
					return y
				}
				return Tanh(y)
			}})
		}
		net.Loss = func(y, l *Node) *Node { d := Sub(y, l); return ReduceAllMean(Mul(d, d)) }
		xs = shapes.Make(dtypes.Float32, 64, 512)
		batch = func(s int) (*tensors.Tensor, *tensors.Tensor) {
			x := make([]float32, 64*512)
			y := make([]float32, 64*512)
			for i := range x {
				x[i] = float32(math.Sin(float64(i*7 + s)))
				y[i] = float32(math.Cos(float64(i*3 + s)))
			}
			return tensors.FromFlatDataAndDimensions(x, 64, 512), tensors.FromFlatDataAndDimensions(y, 64, 512)
		}
	} else {
		m := transformer.New(store.RootScope()).WithVocabSize(1000).WithEmbedDim(128).WithNumLayers(4).WithNumHeads(4).WithHeadDim(32).WithRoPE(10000)
		if net, err = zgomlx.TransformerNet(m, zgomlx.TransformerOptions{}); err != nil {
			panic(err)
		}
		xs = shapes.Make(dtypes.Int32, 4, 32)
		batch = func(s int) (*tensors.Tensor, *tensors.Tensor) {
			x := make([]int32, 128)
			y := make([]int32, 128)
			for i := range x {
				x[i] = int32((i*7 + s) % 1000)
				y[i] = int32((i*7 + s + 1) % 1000)
			}
			return tensors.FromFlatDataAndDimensions(x, 4, 32), tensors.FromFlatDataAndDimensions(y, 4, 32)
		}
	}
	if _, err := zgomlx.InitializeN(b, store, net, []shapes.Shape{xs}); err != nil {
		panic(err)
	}
	cfg := config.Default()
	dir, err := os.MkdirTemp("", "gcm-")
	if err != nil {
		panic(err)
	}
	defer os.RemoveAll(dir)
	cfg.SetScratchDir(dir)
	cfg.ZeroOptimization.OffloadParam.MaxInCPU = 0
	cfg.ZeroOptimization.SubGroupSize = 1 << 16
	cfg.Zinf.Tiers.CPUPinnedBytes = 64 << 20
	var step func(x, y *tensors.Tensor) (float32, error)
	opts := zgomlx.Options{HeapCredit: zgomlx.NoHeapCredit}
	if *credit == "auto" {
		opts.HeapCredit = zgomlx.AutoHeapCredit
	}
	if *mode == "off" {
		tr, err := zgomlx.Create(ctx, b, cfg, store, net, opts)
		if err != nil {
			panic(err)
		}
		defer tr.Close()
		step = func(x, y *tensors.Tensor) (float32, error) { return tr.Step(ctx, x, y) }
	} else {
		mt, err := reference.NewMemoryTrainer(b, store, net, cfg, zgomlx.Options{})
		if err != nil {
			panic(err)
		}
		defer mt.Close()
		step = func(x, y *tensors.Tensor) (float32, error) { return mt.Step(ctx, x, y) }
	}
	for s := range 3 {
		x, y := batch(s)
		if _, err := step(x, y); err != nil {
			panic(err)
		}
	}
	var a, c runtime.MemStats
	runtime.ReadMemStats(&a)
	for s := range *steps {
		x, y := batch(s + 3)
		if _, err := step(x, y); err != nil {
			panic(err)
		}
	}
	runtime.ReadMemStats(&c)
	fmt.Printf("%s %s credit=%s: gc/step %.2f  MB alloc/step %.1f  mallocs/step %d heapinuse %d MB\n", *kind, *mode, *credit,
		float64(c.NumGC-a.NumGC)/float64(*steps), float64(c.TotalAlloc-a.TotalAlloc)/1e6/float64(*steps), (c.Mallocs-a.Mallocs)/uint64(*steps), c.HeapInuse>>20)
}

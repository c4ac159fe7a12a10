package optimizer_test

import (
	"context"
	"fmt"
	"log/slog"
	"math"

	"github.com/zinfio/zinf/buffers"
	"github.com/zinfio/zinf/swapper/optimizer"
)

// constGrads returns the same gradient for every element.
type constGrads float32

// RangeBufferBytes asks for exactly the range's bytes: the values are
// written at the start of dst.
func (c constGrads) RangeBufferBytes(lo, hi int) int { return 4 * (hi - lo) }

func (c constGrads) ReadRange(_ context.Context, _ string, lo, hi int, dst []byte) ([]float32, error) {
	g := buffers.Float32Bytes(dst[:4*(hi-lo)])
	for i := range g {
		g[i] = float32(c)
	}
	return g, nil
}

// Example takes three Adam steps on one tensor whose states are kept in
// pinned memory (no Store). With a constant gradient each step moves every
// weight by about LR.
func Example() {
	ctx := context.Background()
	pool, err := buffers.NewPool(buffers.Options{CapacityBytes: 1 << 20, Pin: buffers.PinOff})
	if err != nil {
		panic(err)
	}
	defer pool.Close()
	opt, err := optimizer.New(optimizer.Options{
		Pool:   pool,
		Grads:  constGrads(0.5),
		Hyper:  optimizer.Hyper{LR: 0.1},
		Logger: slog.New(slog.DiscardHandler),
	})
	if err != nil {
		panic(err)
	}
	defer opt.Close()
	if err := opt.Register("w", []float32{1, -1, 0}); err != nil {
		panic(err)
	}
	for range 3 {
		if err := opt.Step(ctx); err != nil {
			panic(err)
		}
	}
	master, expAvg, _, err := opt.ReadState(ctx, "w")
	if err != nil {
		panic(err)
	}
	fmt.Printf("step %d: master %.4f exp_avg %.4f\n", opt.StepCount(), master, expAvg)
	// Output:
	// step 3: master [0.7000 -1.3000 -0.3000] exp_avg [0.1355 0.1355 0.1355]
}

// ExampleOptimizer_BeginStep overlaps a step with the backward pass: each
// layer's tensor is handed over as soon as its gradient is final (last
// layer first) and is stepped in the background; Commit steps the rest and
// commits. The result is exactly Step's.
func ExampleOptimizer_BeginStep() {
	ctx := context.Background()
	pool, err := buffers.NewPool(buffers.Options{CapacityBytes: 1 << 20, Pin: buffers.PinOff})
	if err != nil {
		panic(err)
	}
	defer pool.Close()
	opt, err := optimizer.New(optimizer.Options{
		Pool:          pool,
		Grads:         constGrads(0.5),
		Hyper:         optimizer.Hyper{LR: 0.1},
		PipelineDepth: 1,
		Logger:        slog.New(slog.DiscardHandler),
	})
	if err != nil {
		panic(err)
	}
	defer opt.Close()
	layers := []string{"layer0", "layer1", "layer2"}
	for _, name := range layers {
		if err := opt.Register(name, []float32{1, -1}); err != nil {
			panic(err)
		}
	}
	txn, err := opt.BeginStep(ctx)
	if err != nil {
		panic(err)
	}
	defer txn.Abort() // does nothing once committed
	for i := len(layers) - 1; i >= 1; i-- {
		// ... backward of layers[i] ...
		if err := txn.Tensor(layers[i]); err != nil {
			break // the step failed in the background; Commit reports it
		}
	}
	// layer0 is not handed over: Commit steps it.
	if err := txn.Commit(ctx); err != nil {
		panic(err)
	}
	for _, name := range layers {
		master, _, _, err := opt.ReadState(ctx, name)
		if err != nil {
			panic(err)
		}
		fmt.Printf("%s: %.4f\n", name, master)
	}
	fmt.Println("handed over:", opt.Stats().Last.HandedOver, "step:", opt.StepCount())
	// Output:
	// layer0: [0.9000 -1.1000]
	// layer1: [0.9000 -1.1000]
	// layer2: [0.9000 -1.1000]
	// handed over: 2 step: 1
}

// ExampleKernel runs one Adam step on the fastest kernel of this CPU (what
// Adam and New choose by default) and on the scalar reference loop, which
// ZINF_OPTIMIZER_KERNEL=scalar or Options.Kernel "scalar" would force: the
// bits are the same.
func ExampleKernel() {
	fast, err := optimizer.KernelByName(optimizer.KernelAuto)
	if err != nil {
		panic(err)
	}
	scalar, err := optimizer.KernelByName(optimizer.KernelScalar)
	if err != nil {
		panic(err)
	}
	const n = 1000 // any length: SIMD kernels run the tail scalar
	run := func(k optimizer.Kernel) []float32 {
		p, g, m, v := make([]float32, n), make([]float32, n), make([]float32, n), make([]float32, n)
		for i := range p {
			p[i], g[i] = float32(i)/n, float32(i%7)-3
		}
		k.Adam(p, g, m, v, 1, optimizer.Hyper{LR: 0.01, WeightDecay: 0.1, AdamW: true})
		return p
	}
	a, b := run(fast), run(scalar)
	same := true
	for i := range a {
		same = same && math.Float32bits(a[i]) == math.Float32bits(b[i])
	}
	fmt.Println("same bits:", same)
	// Output: same bits: true
}

package optimizer_test

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/zinfio/zinf/buffers"
	"github.com/zinfio/zinf/swapper/optimizer"
)

// constGrads returns the same gradient for every element.
type constGrads float32

func (c constGrads) Read(_ context.Context, _ string, dst []float32) error {
	for i := range dst {
		dst[i] = float32(c)
	}
	return nil
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

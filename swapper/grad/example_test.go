package grad_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"

	"github.com/zinfio/zinf/aio"
	"github.com/zinfio/zinf/buffers"
	"github.com/zinfio/zinf/swapper"
	"github.com/zinfio/zinf/swapper/grad"
)

// Example accumulates a gradient over three micro-steps, written behind
// to NVMe, and reads the sum for the optimizer step.
func Example() {
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	dir, _ := os.MkdirTemp("", "zinf-grad-example")
	defer os.RemoveAll(dir)
	pool, _ := buffers.NewPool(buffers.Options{CapacityBytes: 1 << 20, Pin: buffers.PinOff, Logger: quiet})
	defer pool.Close()
	eng, _ := aio.New(aio.Options{Backend: aio.BackendPosix, Logger: quiet})
	defer eng.Close()
	store, _ := swapper.OpenStore(swapper.StoreOptions{Paths: []string{dir}, Engine: eng, Logger: quiet})
	defer store.Close()

	g, err := grad.New(grad.Options{Store: store, Pool: pool, Logger: quiet})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer g.Close()
	ctx := context.Background()
	g.Register("layer0.w", 3)
	for micro := range 3 {
		step := float32(micro + 1)
		if err := g.Accumulate(ctx, "layer0.w", []float32{step, -step, 0.25}); err != nil {
			fmt.Println(err)
			return
		}
	}
	if err := g.Flush(ctx); err != nil {
		fmt.Println(err)
		return
	}
	sum := make([]float32, 3)
	g.Read(ctx, "layer0.w", sum)
	fmt.Println(sum, g.Stats().Writes, "writes")
	g.Zero()
	// Output:
	// [6 -6 0.75] 3 writes
}

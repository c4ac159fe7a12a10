package param_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"

	"github.com/zinfio/zinf/aio"
	"github.com/zinfio/zinf/buffers"
	"github.com/zinfio/zinf/swapper"
	"github.com/zinfio/zinf/swapper/param"
)

// Example streams two bf16 parameters through NVMe with one buffer, then
// commits an optimizer update.
func Example() {
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	dir, _ := os.MkdirTemp("", "zinf-param-example")
	defer os.RemoveAll(dir)
	pool, _ := buffers.NewPool(buffers.Options{CapacityBytes: 1 << 20, Pin: buffers.PinOff, Logger: quiet})
	defer pool.Close()
	eng, _ := aio.New(aio.Options{Backend: aio.BackendPosix, Logger: quiet})
	defer eng.Close()
	store, _ := swapper.OpenStore(swapper.StoreOptions{Paths: []string{dir}, Engine: eng, Checksums: true, Logger: quiet})
	defer store.Close()

	s, err := param.New(param.Options{Store: store, Pool: pool, DType: swapper.BFloat16, BufferCount: 1, Logger: quiet})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer s.Close()
	ctx := context.Background()
	for i, name := range []string{"layer0.w", "layer1.w"} {
		s.Register(name, 4, swapper.TierNVMe)
		s.Init(ctx, name, []float32{float32(i), 0.5, -2, 1.0 / 3})
	}

	s.Prefetch("layer0.w", "layer1.w") // layer1 queues for the one buffer
	w := make([]float32, 4)
	for _, name := range []string{"layer0.w", "layer1.w"} {
		if err := s.Wait(ctx, name); err != nil {
			fmt.Println(err)
			return
		}
		s.ReadFloat32(ctx, name, w)
		fmt.Println(name, s.State(name), w)
		s.Release(name) // no write-back; the next swap-in may start
	}

	s.StageUpdate(ctx, "layer0.w", []float32{9, 9, 9, 9})
	if err := s.CommitUpdates(); err != nil {
		fmt.Println(err)
		return
	}
	s.SwapIn(ctx, "layer0.w")
	s.ReadFloat32(ctx, "layer0.w", w)
	fmt.Println("after the step", w)
	// Output:
	// layer0.w resident [0 0.5 -2 0.33398438]
	// layer1.w resident [1 0.5 -2 0.33398438]
	// after the step [9 9 9 9]
}

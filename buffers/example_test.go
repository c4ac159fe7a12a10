package buffers_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/zinfio/zinf/buffers"
)

func Example() {
	pool, err := buffers.NewPool(buffers.Options{
		CapacityBytes:  1 << 20,
		MinBufferBytes: 4096,
		Pin:            buffers.PinOff, // PinAuto in real use
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer pool.Close()

	ctx := context.Background()
	buf, err := pool.Acquire(ctx, 10000, buffers.PurposeParams)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("len", buf.Len(), "cap", buf.Cap())

	// Typed views share the buffer's memory.
	w := buf.Float32()
	w[0] = 1.5
	half := make([]buffers.BFloat16, 1)
	buffers.Float32ToBFloat16(half, w[:1])
	fmt.Println("float32s", len(w), "bf16", half[0].Float32())

	// An in-flight I/O holds its own reference.
	buf.Retain()
	buf.Release()
	fmt.Println("in use", pool.Stats().InUseBytesByPurpose[buffers.PurposeParams])
	buf.Release() // the last reference: the memory goes back

	// Backpressure: a request that does not fit waits for its context.
	all, _ := pool.Acquire(ctx, 1<<20, buffers.PurposeStaging)
	tctx, cancel := context.WithTimeout(ctx, 10*time.Millisecond)
	defer cancel()
	_, err = pool.Acquire(tctx, 4096, buffers.PurposeOptimizer)
	fmt.Println(errors.Is(err, context.DeadlineExceeded), err)
	all.Release()
	fmt.Println("in use", pool.Stats().InUseBytes)
	// Output:
	// len 10000 cap 12288
	// float32s 2500 bf16 1.5
	// in use 12288
	// true buffers: acquire 4096 bytes for optimizer: context deadline exceeded
	// in use 0
}

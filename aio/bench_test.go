package aio_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/zinfio/zinf/aio"
)

// BenchmarkEngine measures steady-state submit/complete through every
// backend: bytes/s (SetBytes) and allocs/op, which must be 0 — the engine
// allocates nothing per request once a Request has been used once.
func BenchmarkEngine(b *testing.B) {
	for _, backend := range backends(b) {
		for _, sz := range []int{4 << 10, 1 << 20, 16 << 20} {
			for _, op := range []aio.Op{aio.OpWrite, aio.OpRead} {
				b.Run(fmt.Sprintf("%s/%s/%dKiB", backend, op, sz>>10), func(b *testing.B) {
					e := newEngine(b, aio.Options{Backend: backend, QueueDepth: 32, BlockSizeBytes: 1 << 20, Direct: aio.DirectOptional})
					f, err := e.Open(filepath.Join(b.TempDir(), "bench"), os.O_RDWR|os.O_CREATE, 0o644)
					if err != nil {
						b.Fatal(err)
					}
					defer f.Close()
					buf := alignedBuf(b, sz)
					const slots = 16
					if err := f.Truncate(int64(sz * slots)); err != nil {
						b.Fatal(err)
					}
					// Fill the file so reads hit the device, not holes.
					for i := 0; i < slots; i++ {
						if _, err := e.WriteAt(context.Background(), f, buf, int64(i*sz)); err != nil {
							b.Fatal(err)
						}
					}
					var r aio.Request
					run := func(i int) {
						r.Op, r.File, r.Buf, r.Offset = op, f, buf, int64((i%slots)*sz)
						if err := e.Submit(&r); err != nil {
							b.Fatal(err)
						}
						if _, err := r.Wait(); err != nil {
							b.Fatal(err)
						}
					}
					run(0) // first use creates the request's channel
					b.SetBytes(int64(sz))
					b.ReportAllocs()
					b.ResetTimer()
					for i := 0; i < b.N; i++ {
						run(i)
					}
				})
			}
		}
	}
}

// TestSteadyStateAllocs asserts the zero-allocation contract (a behaviour,
// not a speed): submit+wait of a reused Request allocates nothing.
func TestSteadyStateAllocs(t *testing.T) {
	for _, backend := range backends(t) {
		e := newEngine(t, aio.Options{Backend: backend, QueueDepth: 8, BlockSizeBytes: 64 << 10})
		f, err := e.Open(filepath.Join(t.TempDir(), "a"), os.O_RDWR|os.O_CREATE, 0o644)
		if err != nil {
			t.Fatal(err)
		}
		buf := alignedBuf(t, 256<<10)
		var r aio.Request
		op := aio.OpWrite
		n := testing.AllocsPerRun(50, func() {
			r.Op, r.File, r.Buf, r.Offset = op, f, buf, 0
			if err := e.Submit(&r); err != nil {
				t.Fatal(err)
			}
			if _, err := r.Wait(); err != nil {
				t.Fatal(err)
			}
			op = aio.OpRead
		})
		f.Close()
		if n != 0 {
			t.Errorf("%s: %.1f allocations per submit+wait, want 0", backend, n)
		}
	}
}

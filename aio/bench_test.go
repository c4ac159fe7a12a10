package aio_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/zinfio/zinf/aio"
)

// BenchmarkEngine measures steady-state submit/complete through every
// backend: bytes/s (SetBytes) and allocs/op, which must be 0 — the engine
// allocates nothing per request once a Request has been used once. On
// io_uring it runs twice, with the buffer registered (RegisterMemory:
// READ_FIXED/WRITE_FIXED) and without; cpu-ns/B is the process's user and
// system CPU time per byte moved, where registration saves the kernel's
// per-request page pinning.
func BenchmarkEngine(b *testing.B) {
	type variant struct {
		backend    string
		registered bool
	}
	var variants []variant
	for _, backend := range backends(b) {
		variants = append(variants, variant{backend, false})
		if backend == aio.BackendUring {
			variants = append(variants, variant{backend, true})
		}
	}
	for _, v := range variants {
		backend := v.backend
		name := backend
		if v.registered {
			name += "-registered"
		}
		for _, sz := range []int{4 << 10, 1 << 20, 16 << 20} {
			for _, op := range []aio.Op{aio.OpWrite, aio.OpRead} {
				b.Run(fmt.Sprintf("%s/%s/%dKiB", name, op, sz>>10), func(b *testing.B) {
					e := newEngine(b, aio.Options{Backend: backend, QueueDepth: 32, BlockSizeBytes: 1 << 20, Direct: aio.DirectOptional})
					f, err := e.Open(filepath.Join(b.TempDir(), "bench"), os.O_RDWR|os.O_CREATE, 0o644)
					if err != nil {
						b.Fatal(err)
					}
					defer f.Close()
					buf := alignedBuf(b, sz)
					if v.registered {
						if err := e.RegisterMemory(buf); err != nil {
							b.Fatal(err)
						}
					}
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
					cpu0 := cpuTime()
					b.ResetTimer()
					for i := 0; i < b.N; i++ {
						run(i)
					}
					b.StopTimer()
					b.ReportMetric(float64(cpuTime()-cpu0)/float64(b.N)/float64(sz), "cpu-ns/B")
					if v.registered && e.Stats().FixedBufferPieces == 0 {
						b.Fatal("no piece used the registered buffer")
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

// cpuTime is the process's user plus system CPU time.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkEngineMemory moves 16 MiB requests (1 MiB pieces, queue depth
// 32) through the default backend from buffers of four kinds: 4 KiB
// pages or transparent huge pages (as buffers.Pool maps its arena), each
// registered with the engine (RegisterMemory) or not (io_uring only; the
// others have no registration). A 1 MiB piece in huge pages is one
// physically contiguous segment, where 4 KiB pages make it 256, which the
// block layer and a virtual disk handle per segment. Run with -count to
// interleave the variants; cpu-ns/B as in BenchmarkEngine.
func BenchmarkEngineMemory(b *testing.B) {
	const sz = 16 << 20
	e := newEngine(b, aio.Options{QueueDepth: 32, BlockSizeBytes: 1 << 20, Direct: aio.DirectOptional})
	f, err := e.Open(filepath.Join(b.TempDir(), "bench"), os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	const slots = 16
	fill := alignedBuf(b, sz)
	for i := 0; i < slots; i++ {
		if _, err := e.WriteAt(context.Background(), f, fill, int64(i*sz)); err != nil {
			b.Fatal(err)
		}
	}
	for _, huge := range []bool{false, true} {
		for _, registered := range []bool{false, true} {
			if registered && e.Name() != aio.BackendUring {
				continue
			}
			buf := alignedBuf(b, sz)
			if huge {
				buf = hugeBuf(b, sz)
			}
			for _, op := range []aio.Op{aio.OpWrite, aio.OpRead} {
				name := fmt.Sprintf("%s/pages=%s/registered=%v/%s", e.Name(), map[bool]string{false: "4KiB", true: "huge"}[huge], registered, op)
				b.Run(name, func(b *testing.B) {
					if registered {
						if err := e.RegisterMemory(buf); err != nil {
							b.Fatal(err)
						}
						defer e.UnregisterMemory(buf)
					}
					var r aio.Request
					b.SetBytes(sz)
					cpu0 := cpuTime()
					b.ResetTimer()
					for i := 0; i < b.N; i++ {
						r.Op, r.File, r.Buf, r.Offset = op, f, buf, int64((i%slots)*sz)
						if err := e.Submit(&r); err != nil {
							b.Fatal(err)
						}
						if _, err := r.Wait(); err != nil {
							b.Fatal(err)
						}
					}
					b.StopTimer()
					b.ReportMetric(float64(cpuTime()-cpu0)/float64(b.N)/sz, "cpu-ns/B")
				})
			}
		}
	}
}

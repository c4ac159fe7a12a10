package buffers

import (
	"context"
	"math/rand/v2"
	"testing"
)

// BenchmarkAcquireRelease measures the steady-state hot path: one Acquire
// and one Release of a class that is free. Acquire allocates the *Buffer
// handle (1 alloc/op, see the package docs); nothing else allocates.
func BenchmarkAcquireRelease(b *testing.B) {
	for _, size := range []int{4 << 10, 1 << 20, 3<<20 + 5} {
		b.Run(sizeName(size), func(b *testing.B) {
			p := newTestPool(b, 4096) // 16 MiB
			// Some live buffers so the free lists are not trivial.
			keep := make([]*Buffer, 0, 16)
			for range 16 {
				keep = append(keep, mustAcquire(b, p, 64<<10, PurposeParams))
			}
			ctx := context.Background()
			b.ReportAllocs()
			for b.Loop() {
				buf, err := p.Acquire(ctx, size, PurposeStaging)
				if err != nil {
					b.Fatal(err)
				}
				buf.Release()
			}
			for _, k := range keep {
				k.Release()
			}
		})
	}
}

func BenchmarkTryAcquireRelease(b *testing.B) {
	p := newTestPool(b, 1024)
	b.ReportAllocs()
	for b.Loop() {
		buf, _ := p.TryAcquire(64<<10, PurposeGradients)
		buf.Release()
	}
}

// BenchmarkAcquireReleaseParallel has every P acquire and release; the pool
// is sized so nobody waits.
func BenchmarkAcquireReleaseParallel(b *testing.B) {
	p := newTestPool(b, 16384) // 64 MiB
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		ctx := context.Background()
		for pb.Next() {
			buf, err := p.Acquire(ctx, 256<<10, PurposeParams)
			if err != nil {
				b.Error(err)
				return
			}
			buf.Release()
		}
	})
}

// BenchmarkAcquireContended has more demand than budget, so Acquire blocks
// and Release hands memory to waiters (the backpressure path).
func BenchmarkAcquireContended(b *testing.B) {
	p := newTestPool(b, 64) // 256 KiB
	b.ReportAllocs()
	b.SetParallelism(4)
	b.RunParallel(func(pb *testing.PB) {
		ctx := context.Background()
		for pb.Next() {
			buf, err := p.Acquire(ctx, 48<<10, PurposeStaging)
			if err != nil {
				b.Error(err)
				return
			}
			buf.Release()
		}
	})
}

func sizeName(n int) string {
	switch {
	case n%(1<<20) == 0:
		return itoa(n>>20) + "MiB"
	case n%(1<<10) == 0:
		return itoa(n>>10) + "KiB"
	}
	return itoa(n) + "B"
}

func itoa(n int) string {
	if n == 0 {
		return "0"
	}
	var d []byte
	for ; n > 0; n /= 10 {
		d = append([]byte{byte('0' + n%10)}, d...)
	}
	return string(d)
}

const convN = 1 << 16

func randFloats(n int) []float32 {
	r := rand.New(rand.NewPCG(1, 2))
	f := make([]float32, n)
	for i := range f {
		f[i] = float32(r.NormFloat64() * 100)
	}
	return f
}

func BenchmarkFloat32ToBFloat16(b *testing.B) {
	src, dst := randFloats(convN), make([]BFloat16, convN)
	b.SetBytes(convN * 4)
	b.ReportAllocs()
	for b.Loop() {
		Float32ToBFloat16(dst, src)
	}
}

func BenchmarkBFloat16ToFloat32(b *testing.B) {
	src, dst := make([]BFloat16, convN), make([]float32, convN)
	Float32ToBFloat16(src, randFloats(convN))
	b.SetBytes(convN * 2)
	b.ReportAllocs()
	for b.Loop() {
		BFloat16ToFloat32(dst, src)
	}
}

// BenchmarkBFloat16ToFloat32Scalar is the scalar loop the kernel
// replaces, for the ratio.
func BenchmarkBFloat16ToFloat32Scalar(b *testing.B) {
	src, dst := make([]BFloat16, convN), make([]float32, convN)
	Float32ToBFloat16(src, randFloats(convN))
	b.SetBytes(convN * 2)
	b.ReportAllocs()
	for b.Loop() {
		bf16ToFloat32Scalar(dst, src)
	}
}

func BenchmarkFloat32ToFloat16(b *testing.B) {
	src, dst := randFloats(convN), make([]Float16, convN)
	b.SetBytes(convN * 4)
	b.ReportAllocs()
	for b.Loop() {
		Float32ToFloat16(dst, src)
	}
}

func BenchmarkFloat16ToFloat32(b *testing.B) {
	src, dst := make([]Float16, convN), make([]float32, convN)
	Float32ToFloat16(src, randFloats(convN))
	b.SetBytes(convN * 2)
	b.ReportAllocs()
	for b.Loop() {
		Float16ToFloat32(dst, src)
	}
}

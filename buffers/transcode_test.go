package buffers_test

import (
	"bytes"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/zinfio/zinf/buffers"
	"github.com/zinfio/zinf/tensor"
)

// TestTranscode checks every dtype pair against the two-step reference
// (Decode to fp32, Encode to the target) over lengths around the internal
// chunk, values that round both ways, subnormals, infinities and NaN.
func TestTranscode(t *testing.T) {
	dts := []tensor.DType{tensor.Float32, tensor.BFloat16, tensor.Float16}
	rng := rand.New(rand.NewPCG(1, 2))
	for _, n := range []int{0, 1, 3, 511, 512, 513, 1500} {
		vals := make([]float32, n)
		for i := range vals {
			switch i % 7 {
			case 0:
				vals[i] = float32(rng.NormFloat64())
			case 1:
				vals[i] = float32(rng.NormFloat64() * 1e-6)
			case 2:
				vals[i] = float32(rng.NormFloat64() * 7e4)
			case 3:
				vals[i] = math.Float32frombits(rng.Uint32())
			case 4:
				vals[i] = float32(math.Inf(1 - 2*(i%2)))
			case 5:
				vals[i] = 1 + float32(i)*0x1p-20 // ties and near-ties for bf16/fp16
			default:
				vals[i] = float32(math.NaN())
			}
		}
		for _, from := range dts {
			src := make([]byte, n*from.Size())
			buffers.Encode(from, src, vals)
			for _, to := range dts {
				want := make([]float32, n)
				buffers.Decode(from, want, src)
				wantBytes := make([]byte, n*to.Size())
				buffers.Encode(to, wantBytes, want)
				got := make([]byte, n*to.Size()+3) // guard bytes must stay untouched
				got[len(got)-1], got[len(got)-2], got[len(got)-3] = 0xAA, 0xBB, 0xCC
				buffers.Transcode(from, src, to, got[:n*to.Size()])
				for i := range wantBytes {
					if got[i] != wantBytes[i] {
						t.Fatalf("n=%d %s->%s: byte %d is %#x, want %#x", n, from, to, i, got[i], wantBytes[i])
					}
				}
				if got[len(got)-1] != 0xAA || got[len(got)-2] != 0xBB || got[len(got)-3] != 0xCC {
					t.Fatalf("n=%d %s->%s: wrote past the destination", n, from, to)
				}
				// A destination not aligned for its elements (widening to
				// fp32 decodes straight into an aligned one) gives the same
				// bytes.
				odd := make([]byte, n*to.Size()+1)
				buffers.Transcode(from, src, to, odd[1:])
				if !bytes.Equal(odd[1:], wantBytes) {
					t.Fatalf("n=%d %s->%s: into a misaligned destination, the bytes differ", n, from, to)
				}
			}
		}
	}
}

// TestTranscodeAllocatesNothing: a conversion is for hot swap-in paths.
func TestTranscodeAllocatesNothing(t *testing.T) {
	src := make([]byte, 4*10000)
	dst := make([]byte, 2*10000)
	vals := make([]float32, 10000)
	for i := range vals {
		vals[i] = float32(i) / 3
	}
	copy(buffers.Float32Bytes(src), vals)
	if a := testing.AllocsPerRun(20, func() { buffers.Transcode(tensor.Float32, src, tensor.BFloat16, dst) }); a != 0 {
		t.Fatalf("Transcode allocated %.1f times per call, want 0", a)
	}
}

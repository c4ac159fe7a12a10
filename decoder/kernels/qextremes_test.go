package kernels_test

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/zinfio/zinf/decoder/kernels"
)

// Q8_0 and Q4_0 matrices whose blocks hold the extremes of their
// formats (every weight -128 or 127, every nibble 0 or 15, binary16
// scales of zero, of both signs, subnormal, the largest finite), taken
// through the public API with vectors whose blocks quantize to all ±127
// (the integer dot products' largest magnitudes: 4*128*127), to a
// subnormal or zero scale, or to an infinite one, give with every kernel
// the machine has the scalar reference's bits (where the reference
// gives a NaN, a NaN: NaN payloads are not part of the contract), at
// batches 1 to 8 and over several column tiles and row blocks.
func TestQuantizedKernelsExtremes(t *testing.T) {
	const rows, cols = 19, 2048 + 96
	rng := rand.New(rand.NewPCG(7, 8))
	scales := []uint16{0x3c00, 0xbc00, 0x0000, 0x8000, 0x0001, 0x83ff, 0x7bff, 0xfbff, 0x2e66}
	for _, typ := range []kernels.DType{kernels.Q8_0, kernels.Q4_0} {
		rb, err := kernels.RowBytes(typ, cols)
		if err != nil {
			t.Fatal(err)
		}
		bb := rb / (cols / kernels.BlockSize)
		data := make([]byte, rows*rb)
		for blk := 0; blk < len(data); blk += bb {
			h := scales[rng.IntN(len(scales))]
			data[blk], data[blk+1] = byte(h), byte(h>>8)
			q := data[blk+2 : blk+bb]
			switch rng.IntN(5) {
			case 0: // -128 or -8 everywhere
				fill(q, map[kernels.DType]byte{kernels.Q8_0: 0x80, kernels.Q4_0: 0x00}[typ])
			case 1: // 127 or 7 everywhere
				fill(q, map[kernels.DType]byte{kernels.Q8_0: 0x7f, kernels.Q4_0: 0xff}[typ])
			case 2: // the two extremes alternating
				for i := range q {
					q[i] = map[kernels.DType]byte{kernels.Q8_0: 0x80 ^ byte(i&1)*0xff, kernels.Q4_0: 0xf0}[typ]
				}
			default:
				for i := range q {
					q[i] = byte(rng.Uint32())
				}
			}
		}
		w := kernels.Matrix{Type: typ, Rows: rows, Cols: cols, Data: data}
		for batch := 1; batch <= kernels.MaxBatch; batch++ {
			x := make([]float32, batch*cols)
			for c0 := 0; c0 < len(x); c0 += kernels.BlockSize {
				xb := x[c0 : c0+kernels.BlockSize]
				kind := rng.IntN(6)
				if kind == 3 && c0/cols != 2 {
					kind = 4 // the other vectors' sums stay finite
				}
				switch kind {
				case 0, 1: // one magnitude, both signs: quants ±127
					v := float32(math.Ldexp(1, rng.IntN(20)-10))
					for i := range xb {
						xb[i] = v * float32(1-2*rng.IntN(2))
					}
				case 2: // a scale below binary16's normal range, or zero
					for i := range xb {
						xb[i] = float32(rng.NormFloat64() * math.Ldexp(1, -20-rng.IntN(12)))
					}
				case 3: // amax/127 past binary16's range: an infinite scale (vector 2 only)
					for i := range xb {
						xb[i] = float32(rng.NormFloat64() * 1e7)
					}
				default:
					for i := range xb {
						xb[i] = float32(rng.NormFloat64())
					}
				}
			}
			want := product(t, kernels.KernelScalar, w, x, batch)
			for i, v := range want {
				if finite := !math.IsInf(float64(v), 0) && v == v; finite != (i/rows != 2) {
					t.Fatalf("%v, batch %d: y[%d] = %v: only vector 2 should be infinite or NaN", typ, batch, i, v)
				}
			}
			for _, name := range kernels.Kernels() {
				got := product(t, name, w, x, batch)
				for i := range got {
					g, r := got[i], want[i]
					if math.Float32bits(g) != math.Float32bits(r) && !(g != g && r != r) {
						t.Fatalf("%s, %v, batch %d: y[%d] = %v (%#08x), scalar %v (%#08x)",
							name, typ, batch, i, g, math.Float32bits(g), r, math.Float32bits(r))
					}
				}
			}
		}
	}
}

func fill(b []byte, v byte) {
	for i := range b {
		b[i] = v
	}
}

// product returns w times the batch vectors x on a pool of kernel name.
func product(t *testing.T, name string, w kernels.Matrix, x []float32, batch int) []float32 {
	t.Helper()
	p, err := kernels.NewPool(kernels.Options{Kernel: name, Workers: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	y := make([]float32, batch*w.Rows)
	if err := p.MatMul(y, w, x, batch); err != nil {
		t.Fatal(err)
	}
	return y
}

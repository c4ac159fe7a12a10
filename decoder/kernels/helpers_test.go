package kernels

import (
	"fmt"
	"math"
	"math/rand/v2"
)

// randF32 returns a random binary32 of either sign with its magnitude
// spread over 2^-8 .. 2^8, so that sums cancel and round in many ways.
func randF32(rng *rand.Rand) float32 {
	v := float32((rng.Float64()*2 - 1) * math.Ldexp(1, rng.IntN(16)-8))
	return v
}

// randMatrix returns a rows x cols matrix of type t with random weights;
// the block formats get random scales and random quant bytes (every
// nibble and byte value).
func randMatrix(rng *rand.Rand, t DType, rows, cols int) Matrix {
	rb, err := RowBytes(t, cols)
	if err != nil {
		panic(err)
	}
	data := make([]byte, rows*rb)
	switch t {
	case F32:
		for i := 0; i < rows*cols; i++ {
			b := math.Float32bits(randF32(rng))
			data[4*i], data[4*i+1], data[4*i+2], data[4*i+3] = byte(b), byte(b>>8), byte(b>>16), byte(b>>24)
		}
	case BF16:
		for i := 0; i < rows*cols; i++ {
			h := Float32ToBF16(randF32(rng))
			data[2*i], data[2*i+1] = byte(h), byte(h>>8)
		}
	case Q8_0, Q4_0:
		bb := q8BlockBytes
		if t == Q4_0 {
			bb = q4BlockBytes
		}
		for i := 0; i < len(data); i += bb {
			d := float32(math.Ldexp(rng.Float64()+0.5, -rng.IntN(8))) * float32(1-2*rng.IntN(2))
			h := Float32ToHalf(d)
			data[i], data[i+1] = byte(h), byte(h>>8)
			for j := 2; j < bb; j++ {
				data[i+j] = byte(rng.Uint32())
			}
		}
	}
	return Matrix{Type: t, Rows: rows, Cols: cols, Data: data}
}

func randVec(rng *rand.Rand, n int) []float32 {
	x := make([]float32, n)
	for i := range x {
		x[i] = randF32(rng)
	}
	return x
}

// randShape returns a random product shape for type t: odd column counts
// for F32 and BF16, multiples of 32 for the block formats.
func randShape(rng *rand.Rand, t DType) (rows, cols, batch int) {
	rows = 1 + rng.IntN(70)
	if t.quantized() {
		cols = BlockSize * rng.IntN(12)
	} else {
		cols = rng.IntN(300)
	}
	return rows, cols, 1 + rng.IntN(MaxBatch)
}

var allTypes = []DType{F32, BF16, Q8_0, Q4_0}

// diffKernel multiplies random matrices of every type with random batches
// by kernel k and by the scalar reference, and returns an error at the
// first result whose bits differ.
func diffKernel(k *kernel, seed uint64, trials int) error {
	rng := rand.New(rand.NewPCG(seed, 40))
	ref, err := NewPool(Options{Workers: 1, Kernel: KernelScalar})
	if err != nil {
		return err
	}
	defer ref.Close()
	for trial := range trials {
		t := allTypes[trial%len(allTypes)]
		rows, cols, batch := randShape(rng, t)
		if trial < 2*len(allTypes) {
			batch = MaxBatch // every type with a full batch at least once
		}
		if trial%8 >= 6 {
			// Rows of several column tiles.
			cols = BlockSize * (20 + rng.IntN(80))
			if !t.quantized() {
				cols += rng.IntN(BlockSize)
			}
			rows = 1 + rng.IntN(20)
		}
		if err := diffWith(k, ref, rng, t, rows, cols, batch); err != nil {
			return err
		}
	}
	return nil
}

// diffShape compares kernel k with the scalar reference on one random
// product of the given shape.
func diffShape(k *kernel, seed uint64, t DType, rows, cols, batch int) error {
	ref, err := NewPool(Options{Workers: 1, Kernel: KernelScalar})
	if err != nil {
		return err
	}
	defer ref.Close()
	return diffWith(k, ref, rand.New(rand.NewPCG(seed, uint64(cols))), t, rows, cols, batch)
}

func diffWith(k *kernel, ref *Pool, rng *rand.Rand, t DType, rows, cols, batch int) error {
	w := randMatrix(rng, t, rows, cols)
	x := randVec(rng, batch*cols)
	got, want := make([]float32, batch*rows), make([]float32, batch*rows)
	p, err := NewPool(Options{Workers: 1 + rng.IntN(3)})
	if err != nil {
		return err
	}
	p.k = k
	err = p.MatMul(got, w, x, batch)
	p.Close()
	if err != nil {
		return err
	}
	if err := ref.MatMul(want, w, x, batch); err != nil {
		return err
	}
	for i := range got {
		if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
			return fmt.Errorf("%s, %v %d x %d, batch %d: y[%d] (vector %d, row %d) = %v (%#08x), scalar %v (%#08x)",
				k.name, t, rows, cols, batch, i, i/rows, i%rows, got[i], math.Float32bits(got[i]), want[i], math.Float32bits(want[i]))
		}
	}
	return nil
}

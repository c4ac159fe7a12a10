package optimizer

import (
	"math"
	"unsafe"
)

// Adam8Mutants returns kernels whose 8-bit Adam body is a Go model of the
// SIMD kernels' steps (dequantize, Adam's body, the absmax as an unsigned
// maximum of the bits, the divisor guard, y = moment/divisor, the bucket
// lookup and one ordered comparison): the faithful model and one kernel
// per deviation a hand-written kernel could make. The differential test
// (diffAdam8) must pass the faithful one and catch every other, as
// TestAdam8DifferentialCatchesMutants checks; TestDifferentialTestsCatchMutants
// does the same for the other rules.
func Adam8Mutants() []Mutant {
	mk := func(name string) Mutant {
		m := q8mutation(name)
		return Mutant{Name: name, Faithful: name == "faithful", Kernel: Kernel{&kernel{name: "model8-" + name, lanes: 8, adam8: m.adam8Model}}}
	}
	out := []Mutant{mk("faithful")}
	for _, name := range []string{
		"q8/tie-to-lower", "q8/divide-by-reciprocal", "q8/absmax-float-max", "q8/no-zero-guard",
		"q8/nan-code-zero", "q8/bucket-of-magnitude", "q8/skips-last-vector",
	} {
		out = append(out, mk(name))
	}
	return out
}

// q8mutation names the one deviation of an 8-bit model kernel.
type q8mutation string

func (mu q8mutation) adam8Model(p, grad *float32, qm, qv *uint8, am, av *float32, blocks int, args [adamArgCount]float32, mode int, tm, tv *byte, scratch *float32) {
	const b = Blockwise8BlockSize
	n := blocks * b
	P, G := unsafe.Slice(p, n), unsafe.Slice(grad, n)
	QM, QV := unsafe.Slice(qm, n), unsafe.Slice(qv, n)
	AM, AV := unsafe.Slice(am, blocks), unsafe.Slice(av, blocks)
	TM, TV := (*quantTable)(unsafe.Pointer(tm)), (*quantTable)(unsafe.Pointer(tv))
	a := adamArgs{k: args, mode: mode}
	for blk := range blocks {
		lo, hi := blk*b, (blk+1)*b
		if mu == "q8/skips-last-vector" {
			hi -= 8
		}
		var mt, vt [b]float32
		mb, vb := mt[:hi-lo], vt[:hi-lo]
		TM.dequantizeBlock(mb, QM[lo:hi], AM[blk])
		TV.dequantizeBlock(vb, QV[lo:hi], AV[blk])
		adamScalar(P[lo:hi], G[lo:hi], mb, vb, &a)
		AM[blk] = mu.quantize(TM, QM[lo:hi], mb)
		AV[blk] = mu.quantize(TV, QV[lo:hi], vb)
	}
}

// quantize is quantTable.quantizeBlock, step by step as the kernels take
// it, with the model's deviation.
func (mu q8mutation) quantize(t *quantTable, codes []uint8, x []float32) float32 {
	var a float32
	if mu == "q8/absmax-float-max" {
		// VMAXPS(|x|, a): the second operand where either is a NaN.
		for _, v := range x {
			if av := float32(math.Abs(float64(v))); av > a {
				a = av
			}
		}
	} else {
		a = math.Float32frombits(absmaxBits(x))
	}
	d := a
	if d == 0 && mu != "q8/no-zero-guard" {
		d = 1
	}
	for i, v := range x {
		y := v / d
		if mu == "q8/divide-by-reciprocal" {
			y = v * (1 / d)
		}
		k := bucketOf(y)
		if mu == "q8/bucket-of-magnitude" {
			k = bucketOf(float32(math.Abs(float64(y))))
		}
		c := t.bucket[k]
		up := y >= t.thr[c]
		if mu == "q8/tie-to-lower" {
			up = y > t.thr[c]
		}
		if up {
			c++
		}
		if mu == "q8/nan-code-zero" && y != y {
			c = 0
		}
		codes[i] = c
	}
	return a
}

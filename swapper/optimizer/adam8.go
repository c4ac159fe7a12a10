package optimizer

import (
	"fmt"
	"sync"

	"github.com/zinfio/zinf/buffers"
)

// Adam8 is Adam (or AdamW) over 8-bit blockwise moments, on
// DefaultKernel: Kernel.Adam8.
func Adam8(p, g []float32, m, v []uint8, mAbsmax, vAbsmax []float32, step int, h Hyper) {
	DefaultKernel().Adam8(p, g, m, v, mAbsmax, vAbsmax, step, h)
}

// AdamBF16 is Adam (or AdamW) over bfloat16 moments, on DefaultKernel:
// Kernel.AdamBF16.
func AdamBF16(p, g []float32, m, v []buffers.BFloat16, step int, h Hyper) {
	DefaultKernel().AdamBF16(p, g, m, v, step, h)
}

// Adam8 applies one Adam step, number step, to the fp32 master p with
// gradients g, its moments stored 8-bit blockwise (EncodingBlockwise8):
// exp_avg as codes m of SignedDynamicMap with one absmax per block in
// mAbsmax, exp_avg_sq as codes v of UnsignedDynamicMap with vAbsmax.
// Blocks are Blockwise8BlockSize elements from p[0] (the last one may be
// shorter). For each block, in one pass over its memory:
//
//  1. dequantize: m' = map[m]*mAbsmax, v' = map[v]*vAbsmax (QuantMap);
//  2. run Adam's scalar loop on p, g, m', v' (exactly the operations of
//     Adam, so p gets the bits Adam gives on those moments);
//  3. requantize the new m' and v' with their new absmax (QuantMap).
//
// So Adam8 equals, bit for bit, Dequantize, then Adam on the scalar
// kernel, then Quantize, on the whole tensor; every kernel gives those
// bits. g, m and v must hold len(p) elements and each absmax
// FormatBlockwise8.Blocks(len(p)); step must be >= 1; anything else is a
// programming error and panics, as in Adam.
func (k Kernel) Adam8(p, g []float32, m, v []uint8, mAbsmax, vAbsmax []float32, step int, h Hyper) {
	n := len(p)
	blocks := int(FormatBlockwise8.Blocks(int64(n)))
	if len(g) < n || len(m) < n || len(v) < n || len(mAbsmax) < blocks || len(vAbsmax) < blocks {
		panic(fmt.Sprintf("optimizer.Adam8: %d parameters (%d blocks) but %d gradients, %d exp_avg and %d exp_avg_sq codes, %d and %d absmax", n, blocks, len(g), len(m), len(v), len(mAbsmax), len(vAbsmax)))
	}
	a := newAdamArgs(step, h)
	k.impl().runAdam8(p, g[:n], m[:n], v[:n], mAbsmax[:blocks], vAbsmax[:blocks], &a)
}

// AdamBF16 applies one Adam step to the fp32 master p with gradients g,
// its moments m and v stored as bfloat16 (EncodingBF16): each moment is
// widened exactly, Adam's update runs on the float32 values (the bits
// Adam gives on them), and the new moments are rounded to nearest even
// (buffers.BFloat16FromFloat32). g, m and v must hold len(p) elements and
// step must be >= 1, else it panics, as Adam.
func (k Kernel) AdamBF16(p, g []float32, m, v []buffers.BFloat16, step int, h Hyper) {
	n := len(p)
	if len(g) < n || len(m) < n || len(v) < n {
		panic(fmt.Sprintf("optimizer.AdamBF16: %d parameters but %d gradients, %d exp_avg, %d exp_avg_sq", n, len(g), len(m), len(v)))
	}
	a := newAdamArgs(step, h)
	k.impl().runAdamBF16(p, g[:n], m[:n], v[:n], &a)
}

// runAdamBF16 runs AdamBF16 on equal-length operands, a block of
// moments at a time widened into a scratch of the 8-bit kernels' pool
// (adam8Scratch: an array on the stack escaped through runAdam's kernel).
func (k *kernel) runAdamBF16(p, g []float32, m, v []buffers.BFloat16, a *adamArgs) {
	n := len(p)
	scratch := adam8Scratch.Get().(*[adam8ScratchLen]float32)
	defer adam8Scratch.Put(scratch)
	mt, vt := scratch[:Blockwise8BlockSize], scratch[Blockwise8BlockSize:2*Blockwise8BlockSize]
	for lo := 0; lo < n; lo += Blockwise8BlockSize {
		hi := min(lo+Blockwise8BlockSize, n)
		mb, vb := mt[:hi-lo], vt[:hi-lo]
		buffers.BFloat16ToFloat32(mb, m[lo:hi])
		buffers.BFloat16ToFloat32(vb, v[lo:hi])
		k.runAdam(p[lo:hi], g[lo:hi], mb, vb, a)
		buffers.Float32ToBFloat16(m[lo:hi], mb)
		buffers.Float32ToBFloat16(v[lo:hi], vb)
	}
}

// Adam8Step is one step of Adam over 8-bit blockwise moments as the
// optimizer takes it with params p on states in FormatBlockwise8 (Options.
// StateFormat): the gradients are scaled in place (when p.ScaleGrads),
// then Adam8 runs with h.With(p). An in-memory reference that calls it on
// whole tensors (blocks counted from each tensor's first element) gets
// exactly the bits of the optimizer's steps, whose sub-groups start on
// block boundaries (Options.Validate). g is modified.
func Adam8Step(pw, g []float32, m, v []uint8, mAbsmax, vAbsmax []float32, step int, h Hyper, p StepParams) {
	n := len(pw)
	blocks := int(FormatBlockwise8.Blocks(int64(n)))
	if len(g) < n || len(m) < n || len(v) < n || len(mAbsmax) < blocks || len(vAbsmax) < blocks {
		panic(fmt.Sprintf("optimizer.Adam8Step: %d parameters (%d blocks) but %d gradients, %d exp_avg and %d exp_avg_sq codes, %d and %d absmax", n, blocks, len(g), len(m), len(v), len(mAbsmax), len(vAbsmax)))
	}
	if p.ScaleGrads {
		ScaleGrad(g[:n], p.GradScale)
	}
	a := newAdamArgsExact(step, h.With(p))
	DefaultKernel().impl().runAdam8(pw, g[:n], m[:n], v[:n], mAbsmax[:blocks], vAbsmax[:blocks], &a)
}

// AdamBF16Step is AdamStep over bfloat16 moments (FormatBF16): the
// gradients scaled in place (when p.ScaleGrads), then AdamBF16 with
// h.With(p); the bits of the optimizer's steps on such states. g is
// modified.
func AdamBF16Step(pw, g []float32, m, v []buffers.BFloat16, step int, h Hyper, p StepParams) {
	n := len(pw)
	if len(g) < n || len(m) < n || len(v) < n {
		panic(fmt.Sprintf("optimizer.AdamBF16Step: %d parameters but %d gradients, %d exp_avg, %d exp_avg_sq", n, len(g), len(m), len(v)))
	}
	if p.ScaleGrads {
		ScaleGrad(g[:n], p.GradScale)
	}
	a := newAdamArgsExact(step, h.With(p))
	DefaultKernel().impl().runAdamBF16(pw, g[:n], m[:n], v[:n], &a)
}

// adamRecordSplit runs one Adam step with a on rec, a record of a
// compressed layout l (bf16 or 8-bit states), with gradients g, on up to
// workers goroutines. The chunks are whole blocks (Blockwise8BlockSize
// elements), so every block is updated by one call and the bits are those
// of one call over the whole record.
func (k *kernel) adamRecordSplit(l RecordLayout, rec, g []float32, a *adamArgs, workers int) {
	p := l.array(rec, 0)
	n := l.Elems
	g = g[:n]
	switch l.Format.Encoding {
	case EncodingBlockwise8:
		qm, am := l.state8(rec, 1)
		qv, av := l.state8(rec, 2)
		splitAligned(n, workers, Blockwise8BlockSize, func(lo, hi int) {
			b := lo / Blockwise8BlockSize
			k.runAdam8(p[lo:hi], g[lo:hi], qm[lo:hi], qv[lo:hi], am[b:], av[b:], a)
		})
	case EncodingBF16:
		m, v := l.stateBF16(rec, 1), l.stateBF16(rec, 2)
		splitAligned(n, workers, Blockwise8BlockSize, func(lo, hi int) {
			k.runAdamBF16(p[lo:hi], g[lo:hi], m[lo:hi], v[lo:hi], a)
		})
	default:
		panic(fmt.Sprintf("optimizer: adamRecordSplit on a %s record", l.Format))
	}
}

// adam8ScratchLen is the float32s of the scratch the 8-bit kernels get:
// a block's new exp_avg and exp_avg_sq; the next block's map entries of
// both (AVX2); then room for 16 constants broadcast to 16 lanes, or 32
// broadcast to 8 (which the AVX2 kernel reads from memory to keep its
// registers for the update).
const adam8ScratchLen = 4*Blockwise8BlockSize + 16*16

// adam8Scratch recycles the kernels' scratch: a stack array passed
// through the kernel's function value escapes (the compiler cannot see
// that the assembly keeps no pointer), so each call allocated 5 KiB, tens
// of thousands of times an optimizer step.
var adam8Scratch = sync.Pool{New: func() any { return new([adam8ScratchLen]float32) }}

// runAdam8 runs Adam8 on equal-length operands (absmax: one per block):
// the whole blocks on the SIMD body, the last partial block (or all, on
// the scalar kernel) on the reference loop.
func (k *kernel) runAdam8(p, g []float32, qm, qv []uint8, am, av []float32, a *adamArgs) {
	n := len(p)
	full := n / Blockwise8BlockSize
	done := 0
	if k.adam8 != nil && full > 0 {
		scratch := adam8Scratch.Get().(*[adam8ScratchLen]float32)
		t := quantTables()
		k.adam8(&p[0], &g[0], &qm[0], &qv[0], &am[0], &av[0], full, a.k, a.mode, t.signed.bytes(), t.unsigned.bytes(), &scratch[0])
		adam8Scratch.Put(scratch)
		done = full * Blockwise8BlockSize
	}
	if done < n {
		b := done / Blockwise8BlockSize
		adam8Scalar(p[done:n], g[done:n], qm[done:n], qv[done:n], am[b:], av[b:], a)
	}
}

// adam8Scalar is the reference loop of Adam8: per block, dequantize both
// moments into the stack, run adamScalar on them, requantize. The SIMD
// kernels do the same operations in the same order on whole blocks.
func adam8Scalar(p, g []float32, qm, qv []uint8, am, av []float32, a *adamArgs) {
	t := quantTables()
	var mt, vt [Blockwise8BlockSize]float32
	n := len(p)
	for b, lo := 0, 0; lo < n; b, lo = b+1, lo+Blockwise8BlockSize {
		hi := min(lo+Blockwise8BlockSize, n)
		mb, vb := mt[:hi-lo], vt[:hi-lo]
		t.signed.dequantizeBlock(mb, qm[lo:hi], am[b])
		t.unsigned.dequantizeBlock(vb, qv[lo:hi], av[b])
		adamScalar(p[lo:hi], g[lo:hi], mb, vb, a)
		am[b] = t.signed.quantizeBlock(qm[lo:hi], mb)
		av[b] = t.unsigned.quantizeBlock(qv[lo:hi], vb)
	}
}

package kernels

//go:generate sh -c "cd internal/asmgen && go run . -out ../../kernel_amd64.s -stubs ../../kernel_amd64_stubs.go -pkg kernels"
//go:generate sh -c "cd internal/asmgen && go run . -neon ../../kernel_arm64.s -neonstubs ../../kernel_arm64_stubs.go"

// kernel is one implementation of the row products, per dtype.
type kernel struct {
	name      string
	f32, bf16 blockFunc
	// q8_0 and q4 multiply the block formats with quantized vectors.
	q8_0, q4 qblockFunc
	// reduce reduces a row block's partial sums (nil: reduceGo).
	reduce reduceFunc
	// ioF32 and ioBF16 are the in-out products' (MatMulInOut).
	ioF32, ioBF16 ioFunc
	// quant quantizes a block format's vectors as quantizeActs does,
	// bit for bit (nil: quantizeActs).
	quant func(qx []byte, xd []float32, x []float32)
}

// quantize quantizes x (a multiple of BlockSize values) for the block
// formats' products with the kernel's quantizer.
func (k *kernel) quantize(qx []byte, xd []float32, x []float32) {
	if k.quant == nil || len(x) == 0 {
		quantizeActs(qx, xd, x)
		return
	}
	k.quant(qx, xd, x)
}

// inOut returns the kernel's in-out function for t (F32 or BF16).
func (k *kernel) inOut(t DType) ioFunc {
	if t == BF16 {
		return k.ioBF16
	}
	return k.ioF32
}

// reduceFunc sets y[r] for r < rows to the sum of the partial sums
// acc[r][b] in the fixed tree of reduce16 (rows ≥ 1, len(y) ≥ rows).
type reduceFunc func(acc *[rowBlock]accs, b, rows int, y []float32)

// reduceGo is the reduceFunc written in Go, reduce16 a row.
func reduceGo(acc *[rowBlock]accs, b, rows int, y []float32) {
	for r := range rows {
		y[r] = reduce16(&acc[r][b])
	}
}

// reduceRows returns the kernel's reduction of a row block's sums.
func (k *kernel) reduceRows() reduceFunc {
	if k.reduce == nil {
		return reduceGo
	}
	return k.reduce
}

// row returns the kernel's row function for t (F32 or BF16).
func (k *kernel) row(t DType) blockFunc {
	switch t {
	case F32:
		return k.f32
	case BF16:
		return k.bf16
	}
	return nil
}

// qrow returns the kernel's row function for the block format t.
func (k *kernel) qrow(t DType) qblockFunc {
	switch t {
	case Q8_0:
		return k.q8_0
	case Q4_0:
		return k.q4
	}
	return nil
}

// KernelScalar names the scalar reference kernels, which every machine
// has and which define the results.
const KernelScalar = "scalar"

// KernelAVX2 names the amd64 kernels on 256-bit registers (AVX2, FMA and
// F16C).
const KernelAVX2 = "avx2"

var scalarKernel = &kernel{name: KernelScalar, f32: perRow(rowF32Scalar), bf16: perRow(rowBF16Scalar), q8_0: perQRow(rowQ8Scalar), q4: perQRow(rowQ4Scalar),
	ioF32: inOutScalar(F32), ioBF16: inOutScalar(BF16)}

// simdKernels lists the SIMD kernels this machine can run, the preferred
// first; the architecture's init fills it.
var simdKernels []*kernel

// Kernels returns the names of the kernels this machine can run, the one
// products use by default first; KernelScalar is always last.
func Kernels() []string {
	var names []string
	for _, k := range simdKernels {
		names = append(names, k.name)
	}
	return append(names, KernelScalar)
}

// findKernel returns the kernel named name ("" for the default).
func findKernel(name string) *kernel {
	if name == "" {
		if len(simdKernels) > 0 {
			return simdKernels[0]
		}
		return scalarKernel
	}
	for _, k := range simdKernels {
		if k.name == name {
			return k
		}
	}
	if name == KernelScalar {
		return scalarKernel
	}
	return nil
}

// sumF32 returns the sum of the values of w in the 16-lane order, with the
// SIMD of the machine's first kernel where len(w) is a multiple of Lanes:
// the benchmarks' memory-read figure, against which the products' reading
// of weights is measured.
var sumF32 = func(w []float32) float32 {
	var acc [Lanes]float32
	for i := 0; i+Lanes <= len(w); i += Lanes {
		for j := range Lanes {
			acc[j] += w[i+j]
		}
	}
	return reduce16(&acc)
}

package kernels

import (
	"fmt"
	"unsafe"
)

// Strided products of float32 values in the caller's memory, on the
// calling goroutine: the attention of a decoder over its KV cache, whose
// rows for one head lie a position's keys (or values) apart.

// Scratch holds the partial sums of Dots; the caller keeps one per
// goroutine so that a call allocates nothing.
type Scratch struct {
	acc [rowBlock]accs
}

// checkStrided checks a strided product's shapes: rows rows of cols
// values, stride apart, in w.
func checkStrided(w []float32, stride, rows, cols int) error {
	if rows < 0 || cols < 0 || rows > MaxDim || cols > MaxDim || stride < cols || stride > MaxDim {
		return fmt.Errorf("kernels: strided product of %d rows x %d cols, stride %d: want rows and cols in 0..%d and stride in cols..%d", rows, cols, stride, MaxDim, MaxDim)
	}
	if rows > 0 && cols > 0 && (len(w) < cols || (len(w)-cols)/stride < rows-1) {
		return fmt.Errorf("kernels: strided product of %d rows x %d cols, stride %d: w has %d values, want at least %d", rows, cols, stride, len(w), (rows-1)*stride+cols)
	}
	return nil
}

// Dots sets y[r] = sum over c < cols of w[r*stride+c] * x[c] for each
// r < rows (len(y) == rows, len(x) == cols), each sum in MatMul's order
// and with its bits (those of an F32 Matrix of the rows), with the
// machine's first kernel on the calling goroutine; sc is the caller's
// scratch. Bad shapes return an error and leave y untouched.
func Dots(y, w []float32, stride, rows, cols int, x []float32, sc *Scratch) error {
	return dots(findKernel(""), y, w, stride, rows, cols, x, sc)
}

func dots(k *kernel, y, w []float32, stride, rows, cols int, x []float32, sc *Scratch) error {
	if err := checkStrided(w, stride, rows, cols); err != nil {
		return err
	}
	if len(y) != rows || len(x) != cols || sc == nil {
		return fmt.Errorf("kernels: Dots of %d rows x %d cols: y has %d values (want %d), x %d (want %d), scratch %v", rows, cols, len(y), rows, len(x), cols, sc != nil)
	}
	if rows == 0 {
		return nil
	}
	if cols == 0 {
		clear(y)
		return nil
	}
	wb := unsafe.Slice((*byte)(unsafe.Pointer(&w[0])), 4*len(w))
	n := cols &^ (Lanes - 1)
	row, reduce := k.f32, k.reduceRows()
	for r0 := 0; r0 < rows; r0 += rowBlock {
		r1 := min(rows, r0+rowBlock)
		ys := y[r0:r1]
		if n > 0 {
			for r := r0; r < r1; r++ {
				clear(sc.acc[r-r0][:1])
			}
			row(wb[4*r0*stride:], 4*stride, r1-r0, n, x, cols, 1, &sc.acc)
			reduce(&sc.acc, 0, r1-r0, ys)
		} else {
			clear(ys)
		}
		// The tail past the last whole group of Lanes columns, as
		// MatMul's.
		for r := r0; r < r1; r++ {
			wr := w[r*stride:][:cols]
			s := ys[r-r0]
			for c := n; c < cols; c++ {
				s = FMA32(wr[c], x[c], s)
			}
			ys[r-r0] = s
		}
	}
	return nil
}

// WeightedSum sets y[c] = sum over r < rows of x[r] * w[r*stride+c] for
// each c < cols (len(y) == cols, len(x) == rows): every sum starts at +0
// and takes the rows in increasing order, one FMA32 each (MatMulInOut's
// order and bits for an F32 matrix of the rows), with the machine's first
// kernel on the calling goroutine. Bad shapes return an error and leave
// y untouched.
func WeightedSum(y, w []float32, stride, rows, cols int, x []float32) error {
	return weightedSum(findKernel(""), y, w, stride, rows, cols, x)
}

func weightedSum(k *kernel, y, w []float32, stride, rows, cols int, x []float32) error {
	if err := checkStrided(w, stride, rows, cols); err != nil {
		return err
	}
	if len(y) != cols || len(x) != rows {
		return fmt.Errorf("kernels: WeightedSum of %d rows x %d cols: y has %d values (want %d), x %d (want %d)", rows, cols, len(y), cols, len(x), rows)
	}
	clear(y)
	if rows == 0 || cols == 0 {
		return nil
	}
	wb := unsafe.Slice((*byte)(unsafe.Pointer(&w[0])), 4*len(w))
	wide := cols &^ 7
	io, tail := k.inOut(F32), inOutScalar(F32)
	for r0 := 0; r0 < rows; r0 += ioRowBlock {
		nr := min(ioRowBlock, rows-r0)
		wr := wb[4*r0*stride:]
		if wide > 0 {
			io(wr, 4*stride, nr, wide, x[r0:], rows, 1, y, cols)
		}
		if wide < cols {
			tail(wr[4*wide:], 4*stride, nr, cols-wide, x[r0:], rows, 1, y[wide:], cols)
		}
	}
	return nil
}

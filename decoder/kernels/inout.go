package kernels

import "fmt"

// In-out products: a matrix stored in features by out features (GoMLX's
// dense layers, the zoo's output head), row i holding input i's weights
// for every output. Each output's sum is a dot product down a column, so
// the kernels go the other way round: for each row, a broadcast input
// times the row's weights, added into the sums of many outputs at once
// (an axpy a row), which reads the weights in the order they lie.

// ioFunc adds, for rows rows of a tile of n columns of an in-out matrix
// (row i's first weight of the tile at w[i*wstride:], in the kernel's
// dtype) and nb ≤ MaxBatch vectors (vector b's input for row i at
// x[b*xstride+i]), x[b][i] * W[i][c] into y[b*ystride+c], row after row
// in increasing order, one FMA32 each.
type ioFunc func(w []byte, wstride, rows, n int, x []float32, xstride, nb int, y []float32, ystride int)

// ioRowBlock is the number of rows an in-out chunk takes through its
// columns at a time: the sums of its outputs are loaded and stored once a
// block and tile, and each of the block's rows is read as one sequential
// stream, which the hardware prefetchers follow.
const ioRowBlock = 8

// minColsPerWorker keeps small in-out products on fewer goroutines.
const minColsPerWorker = 128

// inOutScalar returns the scalar reference of the in-out products for an
// F32 or BF16 matrix: the definition of their results.
func inOutScalar(t DType) ioFunc {
	return func(w []byte, wstride, rows, n int, x []float32, xstride, nb int, y []float32, ystride int) {
		for i := range rows {
			row := w[i*wstride:]
			for b := range nb {
				xi := x[b*xstride+i]
				yb := y[b*ystride:][:n]
				for c := range yb {
					yb[c] = FMA32(xi, weightAt(t, row, c), yb[c])
				}
			}
		}
	}
}

// MatMulInOut computes y[b*Cols+c] = sum over r of x[b*Rows+r] * W[r][c]
// for the batch vectors b (1 to MaxBatch) on a pool of GOMAXPROCS
// workers shared by the process. See Pool.MatMulInOut.
func MatMulInOut(y []float32, w Matrix, x []float32, batch int) error {
	return defaultPool().MatMulInOut(y, w, x, batch)
}

// MatMulInOut computes y[b*Cols+c] = sum over r of x[b*Rows+r] * W[r][c]
// for the batch vectors b (1 to MaxBatch) and an F32 or BF16 matrix W
// stored in features by out features: Rows is the number of inputs, Cols
// of outputs (W's transpose is the out-in Matrix MatMul takes). x holds
// batch*Rows values, y batch*Cols. Each weight is read from memory once
// for the whole batch, the rows in the order they lie. Every output's sum
// starts at +0 and takes the rows in increasing order, one FMA32 each:
// every kernel, split and batch size gives the same bits (not those of
// MatMul on the transposed matrix, whose order differs). The columns are
// split into contiguous ranges over the pool's workers. Bad shapes or a
// block format return an error and leave y untouched.
func (p *Pool) MatMulInOut(y []float32, w Matrix, x []float32, batch int) error {
	if w.Type != F32 && w.Type != BF16 {
		return fmt.Errorf("kernels: an in-out product takes an f32 or bf16 matrix, not %v", w.Type)
	}
	if batch < 1 || batch > MaxBatch {
		return fmt.Errorf("kernels: batch %d is outside 1..%d", batch, MaxBatch)
	}
	if w.Rows < 0 || w.Cols < 0 || w.Rows > MaxDim || w.Cols > MaxDim {
		return fmt.Errorf("kernels: matrix shape %d x %d is outside 0..%d", w.Rows, w.Cols, MaxDim)
	}
	rb, _ := RowBytes(w.Type, w.Cols) // f32 and bf16 take any count
	if w.Rows > 0 && rb > 0 && w.Rows > len(w.Data)/rb || w.Rows*rb != len(w.Data) {
		return fmt.Errorf("kernels: an in-out %v matrix of %d rows (inputs) x %d cols (outputs) takes %d bytes a row, Data has %d bytes (want rows*%d)", w.Type, w.Rows, w.Cols, rb, len(w.Data), rb)
	}
	if len(x) != batch*w.Rows {
		return fmt.Errorf("kernels: x has %d values, want batch %d x rows (inputs) %d = %d", len(x), batch, w.Rows, batch*w.Rows)
	}
	if len(y) != batch*w.Cols {
		return fmt.Errorf("kernels: y has %d values, want batch %d x cols (outputs) %d = %d", len(y), batch, w.Cols, batch*w.Cols)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return ErrClosed
	}
	// One chunk a worker, not chunksPerWorker: a chunk reads its columns'
	// part of every row, and narrower parts (128 columns of f32 for the
	// decoder's 1024) made the step of in-out f32 weights slower, not
	// faster.
	chunks := max(1, min(p.workers, w.Cols/minColsPerWorker))
	p.job = job{w: w, io: p.k.inOut(w.Type), rb: rb, x: x, y: y, batch: batch, chunks: chunks, inout: true}
	p.runJob()
	p.job = job{} // drop the references to the caller's slices
	return nil
}

// runInOut computes chunk i of an in-out job's columns: a range whose
// ends are multiples of 8 (the last chunk also takes the columns past the
// last multiple of 8, on the scalar reference), in blocks of ioRowBlock
// rows.
func (j *job) runInOut(i int) {
	ins, outs := j.w.Rows, j.w.Cols
	whole := outs &^ 7
	lo := whole * i / j.chunks &^ 7
	hi := whole * (i + 1) / j.chunks &^ 7
	tail := 0
	if i == j.chunks-1 {
		hi, tail = whole, outs-whole
	}
	for b := range j.batch {
		clear(j.y[b*outs+lo : b*outs+hi+tail])
	}
	if ins == 0 {
		return
	}
	es := j.rb / max(outs, 1) // bytes a value
	// The columns in spans whose sums stay in the first level cache
	// while every row block passes over them.
	span := max(64, ioSumBytes/4/j.batch/64*64)
	for c0 := lo; c0 < hi+tail; c0 += span {
		c1 := min(c0+span, hi)
		if c1 >= hi {
			c1 = hi + tail // the last span takes the tail
		}
		wide := min(c1, hi) - c0 // columns on the kernel, a multiple of 8
		for r0 := 0; r0 < ins; r0 += ioRowBlock {
			rows := min(ioRowBlock, ins-r0)
			w := j.w.Data[r0*j.rb:]
			if wide > 0 {
				j.io(w[c0*es:], j.rb, rows, wide, j.x[r0:], ins, j.batch, j.y[c0:], outs)
			}
			if c1 > hi {
				inOutScalar(j.w.Type)(w[hi*es:], j.rb, rows, c1-hi, j.x[r0:], ins, j.batch, j.y[hi:], outs)
			}
		}
		if c1 >= hi {
			break
		}
	}
}

// ioSumBytes bounds the outputs' sums (all the batch's vectors) an
// in-out chunk keeps in the first level cache while its rows pass over
// them: past it the sums would go to memory and back once per row block.
const ioSumBytes = 16 << 10

// SumF32 returns the sum of w in the 16-lane order of the products, with
// the SIMD of the machine's first kernel where len(w) is a multiple of
// Lanes: a plain read of memory, which benchmarks run beside a product to
// measure the memory's bandwidth the product's reading of weights is a
// share of.
func SumF32(w []float32) float32 { return sumF32(w) }

// Parallel calls f(0) ... f(chunks-1), at most Workers() of them at once,
// on the pool's goroutines (f(0) on the calling one), and returns when
// every call has returned: the fan-out of the rest of a decoding step
// (attention) on the goroutines the products already run on, with no
// goroutine started and nothing allocated per call (f itself made once).
// chunks above Workers() is an error, as is a closed pool. Calls run
// between products, never beside one.
func (p *Pool) Parallel(chunks int, f func(chunk int)) error {
	if chunks < 1 || chunks > p.workers {
		return fmt.Errorf("kernels: Parallel over %d chunks, want 1..%d (the pool's workers)", chunks, p.workers)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return ErrClosed
	}
	p.job = job{fn: f, chunks: chunks}
	p.runJob()
	p.job = job{}
	return nil
}

// Parallel is Pool.Parallel on the pool of GOMAXPROCS workers that
// MatMul and MatMulInOut share.
func Parallel(chunks int, f func(chunk int)) error { return defaultPool().Parallel(chunks, f) }

// DefaultWorkers returns the number of workers of the pool MatMul,
// MatMulInOut and Parallel share.
func DefaultWorkers() int { return defaultPool().Workers() }

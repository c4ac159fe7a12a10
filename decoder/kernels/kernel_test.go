package kernels

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"
)

func seedNow() uint64 { return uint64(time.Now().UnixNano()) }

// TestKernelsMatchScalar runs every SIMD kernel the machine has against
// the scalar reference on random shapes (odd column counts for f32 and
// bf16, batches 1 to 8, 1 to 3 workers) and requires equal bits.
func TestKernelsMatchScalar(t *testing.T) {
	if len(simdKernels) == 0 {
		t.Skip("no SIMD kernel on this machine: products use the scalar reference")
	}
	seed := seedNow()
	t.Logf("seed %d", seed)
	for _, k := range simdKernels {
		if err := diffKernel(k, seed, 600); err != nil {
			t.Error(err)
		}
	}
}

// TestKernelsLongRows covers rows far longer than the random shapes, as
// the decoder's layers have them.
func TestKernelsLongRows(t *testing.T) {
	seed := seedNow()
	for _, k := range simdKernels {
		for _, ty := range allTypes {
			cols := []int{4096, 11008 + 32}
			if !ty.quantized() {
				cols = append(cols, 11008+21) // a tail of 5 columns
			}
			for _, cols := range cols {
				if err := diffShape(k, seed, ty, 9, cols, 8); err != nil {
					t.Error(err)
				}
			}
		}
	}
}

// TestDifferentialTestsCatchMutants runs the differential test on Go
// models of the AVX2 kernels (modelKernel): the faithful model (two
// 8-lane accumulators a vector loaded and stored around a run of columns,
// groups of four vectors) must pass, and every model with one deviation a
// hand-written kernel could have must fail. That shows the differential
// test would catch such a mistake in the assembly.
func TestDifferentialTestsCatchMutants(t *testing.T) {
	seed := seedNow()
	t.Logf("seed %d", seed)
	for _, m := range append([]string{"faithful"}, mutations...) {
		t.Run(m, func(t *testing.T) {
			err := diffKernel(modelKernel(m), seed, 120)
			switch {
			case m == "faithful" && err != nil:
				t.Fatalf("the faithful model differs from the scalar reference: %v", err)
			case m != "faithful" && err == nil:
				t.Fatalf("the differential test let the mutant %q through", m)
			case err != nil:
				t.Logf("caught: %v", err)
			}
		})
	}
}

// mutations name the deviations of the model kernels.
var mutations = []string{
	"unfused-multiply-add",  // multiply, round, add, round
	"float64-accumulator",   // partial sums in float64, rounded at the end
	"acc-not-loaded",        // partial sums restarted at zero in every column tile
	"q4-nibbles-swapped",    // high nibbles first
	"q4-unsigned-nibbles",   // nibble without the offset 8
	"q8-unsigned-bytes",     // quants as uint8
	"scale-as-bf16",         // the block scale read as bfloat16
	"bf16-as-half",          // bf16 weights read as binary16
	"second-group-same-x",   // vectors 4..7 multiplied with vectors 0..3
	"skips-last-16-columns", // the loop stops a group early
	"lanes-0-1-swapped",     // columns 0 and 1 mod 16 feed each other's partial sums
}

// modelKernel returns Go models of the AVX2 kernels, with mutation m.
func modelKernel(m string) *kernel {
	return &kernel{name: "model-" + m, f32: perRow(modelRow(F32, m)), bf16: perRow(modelRow(BF16, m)), q8_0: perQRow(modelQRow(Q8_0, m)), q4: perQRow(modelQRow(Q4_0, m))}
}

// modelQRow models the AVX2 block-format kernels: one 8-lane accumulator
// a vector, loaded and stored around a run of columns, groups of four
// vectors, each block's weights unpacked into 32 signed bytes, 16-bit
// sums of adjacent pairs, 32-bit sums of adjacent pairs of those.
func modelQRow(t DType, m string) qrowFunc {
	return func(w []byte, n int, qx []byte, xd []float32, xstride, dstride, nb int, acc *accs) {
		for b0 := 0; b0 < nb; b0 += 4 {
			k := min(4, nb-b0)
			xo, do := b0*xstride, b0*dstride
			if m == "second-group-same-x" {
				xo, do = 0, 0
			}
			var y [4][QLanes]float32
			var y64 [4][QLanes]float64
			for b := range k {
				if m != "acc-not-loaded" {
					copy(y[b][:], acc[b0+b][:QLanes])
				}
				for j := range QLanes {
					y64[b][j] = float64(y[b][j])
				}
			}
			for c := 0; c < n; c += BlockSize {
				if m == "skips-last-16-columns" && c+BlockSize == n && n > BlockSize {
					break
				}
				q, dw := modelQLoad(t, w, c, m)
				for b := range k {
					xb := qx[xo+b*xstride+c:]
					s := dw * xd[do+b*dstride+c/BlockSize]
					for j := range QLanes {
						l := j
						if m == "lanes-0-1-swapped" && j < 2 {
							l = 1 - j
						}
						var dot int32
						for i := 4 * j; i < 4*j+4; i++ {
							dot += q[i] * int32(int8(xb[i]))
						}
						switch m {
						case "unfused-multiply-add":
							y[b][l] = y[b][l] + float32(float32(dot)*s)
						case "float64-accumulator":
							y64[b][l] += float64(dot) * float64(s)
						default:
							y[b][l] = FMA32(float32(dot), s, y[b][l])
						}
					}
				}
			}
			for b := range k {
				if m == "float64-accumulator" {
					for j := range QLanes {
						y[b][j] = float32(y64[b][j])
					}
				}
				copy(acc[b0+b][:QLanes], y[b][:])
			}
		}
	}
}

// modelQLoad returns the quants and the scale of the block at column c.
func modelQLoad(t DType, w []byte, c int, m string) ([BlockSize]int32, float32) {
	var q [BlockSize]int32
	bb := q8BlockBytes
	if t == Q4_0 {
		bb = q4BlockBytes
	}
	blk := w[c/BlockSize*bb:]
	d := HalfToFloat32(le16(blk))
	if m == "scale-as-bf16" {
		d = BF16ToFloat32(le16(blk))
	}
	switch t {
	case Q8_0:
		for i := range BlockSize {
			q[i] = int32(int8(blk[2+i]))
			if m == "q8-unsigned-bytes" {
				q[i] = int32(blk[2+i])
			}
		}
	case Q4_0:
		off := int32(8)
		if m == "q4-unsigned-nibbles" {
			off = 0
		}
		for j := range BlockSize / 2 {
			lo, hi := int32(blk[2+j]&0xf)-off, int32(blk[2+j]>>4)-off
			if m == "q4-nibbles-swapped" {
				lo, hi = hi, lo
			}
			q[j], q[j+BlockSize/2] = lo, hi
		}
	}
	return q, d
}

func modelRow(t DType, m string) rowFunc {
	return func(w []byte, n int, x []float32, xstride, nb int, acc *accs) {
		if n == 0 {
			return
		}
		for b0 := 0; b0 < nb; b0 += 4 {
			k := min(4, nb-b0)
			xo := b0 * xstride
			if m == "second-group-same-x" {
				xo = 0
			}
			// The Y registers: A (lanes 0-7) and B (8-15) of each vector,
			// loaded from acc.
			var y [4][Lanes]float32
			var y64 [4][Lanes]float64
			for b := range k {
				if m != "acc-not-loaded" {
					y[b] = acc[b0+b]
				}
				for j := range Lanes {
					y64[b][j] = float64(y[b][j])
				}
			}
			for c := 0; c < n; c += Lanes {
				if m == "skips-last-16-columns" && c+Lanes == n && n > Lanes {
					break
				}
				wv := modelLoad(t, w, c, m)
				for b := range k {
					for j := range Lanes {
						l := j
						if m == "lanes-0-1-swapped" && j < 2 {
							l = 1 - j
						}
						xv := x[xo+b*xstride+c+j]
						switch m {
						case "unfused-multiply-add":
							// The conversion rounds the product: without
							// it Go may fuse the two (it does on arm64).
							y[b][l] = y[b][l] + float32(wv[j]*xv)
						case "float64-accumulator":
							y64[b][l] += float64(wv[j]) * float64(xv)
						default:
							y[b][l] = FMA32(wv[j], xv, y[b][l])
						}
					}
				}
			}
			for b := range k {
				if m == "float64-accumulator" {
					for j := range Lanes {
						y[b][j] = float32(y64[b][j])
					}
				}
				acc[b0+b] = y[b]
			}
		}
	}
}

// modelLoad widens the 16 weights of columns [c, c+16).
func modelLoad(t DType, w []byte, c int, m string) [Lanes]float32 {
	var v [Lanes]float32
	scale := func(blk []byte) float32 {
		if m == "scale-as-bf16" {
			return BF16ToFloat32(le16(blk))
		}
		return HalfToFloat32(le16(blk))
	}
	switch t {
	case F32:
		for j := range Lanes {
			v[j] = f32At(w, c+j)
		}
	case BF16:
		for j := range Lanes {
			if m == "bf16-as-half" {
				v[j] = HalfToFloat32(le16(w[2*(c+j):]))
			} else {
				v[j] = BF16ToFloat32(le16(w[2*(c+j):]))
			}
		}
	case Q8_0:
		blk := w[c/BlockSize*q8BlockBytes:]
		d := scale(blk)
		for j := range Lanes {
			q := blk[2+c%BlockSize+j]
			if m == "q8-unsigned-bytes" {
				v[j] = float32(q) * d
			} else {
				v[j] = float32(int8(q)) * d
			}
		}
	case Q4_0:
		blk := w[c/BlockSize*q4BlockBytes:]
		d := scale(blk)
		high := c%BlockSize != 0
		if m == "q4-nibbles-swapped" {
			high = !high
		}
		for j := range Lanes {
			q := blk[2+j] & 0xf
			if high {
				q = blk[2+j] >> 4
			}
			off := int32(8)
			if m == "q4-unsigned-nibbles" {
				off = 0
			}
			v[j] = float32(int32(q)-off) * d
		}
	}
	return v
}

// TestReduceMatchesReduce16 holds every SIMD kernel's reduction of a row
// block's partial sums (the amd64 kernels reduce them in assembly) to
// reduce16, bit for bit, for every number of rows and every vector of a
// block, on sums of mixed signs and magnitudes that cancel.
func TestReduceMatchesReduce16(t *testing.T) {
	seed := seedNow()
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 7))
	for _, k := range append(simdKernels, scalarKernel) {
		reduce := k.reduceRows()
		for range 200 {
			var acc [rowBlock]accs
			for r := range acc {
				for b := range acc[r] {
					for j := range acc[r][b] {
						acc[r][b][j] = float32(rng.NormFloat64() * math.Exp2(float64(rng.IntN(40)-20)))
					}
				}
			}
			rows, b := 1+rng.IntN(rowBlock), rng.IntN(MaxBatch)
			y := make([]float32, rows+1)
			y[rows] = 42 // past the rows: left alone
			reduce(&acc, b, rows, y)
			for r := range rows {
				if want := reduce16(&acc[r][b]); math.Float32bits(y[r]) != math.Float32bits(want) {
					t.Fatalf("%s: rows %d, vector %d: y[%d] = %v, reduce16 %v", k.name, rows, b, r, y[r], want)
				}
			}
			if y[rows] != 42 {
				t.Fatalf("%s: rows %d: wrote y[%d]", k.name, rows, rows)
			}
		}
	}
}

// TestPoolSpinningWorkers runs products on pools whose workers poll for
// chunks rather than block (their first 200 µs idle): with one processor
// and four workers (the pollers must yield it to the others), with
// products back to back and after the workers have gone back to
// blocking, and closes them while they poll, under a watchdog. Every
// result must be the scalar reference's, and a closed pool must refuse.
func TestPoolSpinningWorkers(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	done := make(chan struct{})
	go func() {
		defer close(done)
		rng := rand.New(rand.NewPCG(seedNow(), 9))
		ref, _ := NewPool(Options{Workers: 1, Kernel: KernelScalar})
		defer ref.Close()
		for _, workers := range []int{2, 4} {
			p, err := NewPool(Options{Workers: workers})
			if err != nil {
				t.Error(err)
				return
			}
			for k := range 6 {
				w := randMatrix(rng, F32, 16*workers+3, 48)
				x := randVec(rng, 2*48)
				y, want := make([]float32, 2*w.Rows), make([]float32, 2*w.Rows)
				if err := p.MatMul(y, w, x, 2); err != nil {
					t.Error(err)
					return
				}
				if err := ref.MatMul(want, w, x, 2); err != nil {
					t.Error(err)
					return
				}
				for i := range y {
					if math.Float32bits(y[i]) != math.Float32bits(want[i]) {
						t.Errorf("workers %d, product %d: y[%d] = %v, want %v", workers, k, i, y[i], want[i])
						return
					}
				}
				if k == 3 {
					time.Sleep(time.Millisecond) // past workerSpin: the workers block
				}
			}
			p.Close()
			if err := p.Parallel(1, func(int) {}); !errors.Is(err, ErrClosed) {
				t.Errorf("workers %d: Parallel after Close: %v, want ErrClosed", workers, err)
			}
		}
	}()
	select {
	case <-done:
	case <-time.After(time.Minute):
		t.Fatal("the products did not finish in a minute")
	}
}

// TestPoolCallerTakesEveryChunk runs row and in-out products and a
// Parallel on a pool whose workers never come (none started): the
// calling goroutine must take every chunk of the hand-out itself and
// give the scalar reference's bits, so that a worker held up elsewhere
// (a busy core) delays nobody. Before chunks were taken from a shared
// counter each was handed to a worker by a channel and the caller waited
// for it: this pool never finished a product. Runs under a watchdog.
func TestPoolCallerTakesEveryChunk(t *testing.T) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		rng := rand.New(rand.NewPCG(seedNow(), 10))
		ref, _ := NewPool(Options{Workers: 1, Kernel: KernelScalar})
		defer ref.Close()
		const workers = 4
		p := &Pool{k: findKernel(""), workers: workers, scratch: make([]chunkScratch, workers)}
		p.park, p.done = sync.NewCond(&p.parkMu), sync.NewCond(&p.doneMu)
		for _, typ := range []DType{F32, BF16, Q8_0} {
			w := randMatrix(rng, typ, 16*chunksPerWorker*workers+5, 64)
			x := randVec(rng, 3*64)
			y, want := make([]float32, 3*w.Rows), make([]float32, 3*w.Rows)
			if err := p.MatMul(y, w, x, 3); err != nil {
				t.Error(err)
				return
			}
			if err := ref.MatMul(want, w, x, 3); err != nil {
				t.Error(err)
				return
			}
			if err := sameBits(y, want); err != nil {
				t.Errorf("%v row product: %v", typ, err)
			}
		}
		w := randMatrix(rng, F32, 40, minColsPerWorker*workers+3)
		x := randVec(rng, 2*40)
		y, want := make([]float32, 2*w.Cols), make([]float32, 2*w.Cols)
		if err := p.MatMulInOut(y, w, x, 2); err != nil {
			t.Error(err)
			return
		}
		if err := ref.MatMulInOut(want, w, x, 2); err != nil {
			t.Error(err)
			return
		}
		if err := sameBits(y, want); err != nil {
			t.Errorf("in-out product: %v", err)
		}
		var ran [workers]int
		if err := p.Parallel(workers, func(c int) { ran[c]++ }); err != nil {
			t.Error(err)
		}
		if ran != [workers]int{1, 1, 1, 1} {
			t.Errorf("Parallel(%d) ran the chunks %v times, want once each", workers, ran)
		}
	}()
	select {
	case <-done:
	case <-time.After(time.Minute):
		t.Fatal("the products did not finish in a minute")
	}
}

// sameBits says where y and want differ first, bit for bit.
func sameBits(y, want []float32) error {
	for i := range y {
		if math.Float32bits(y[i]) != math.Float32bits(want[i]) {
			return fmt.Errorf("y[%d] = %v, want %v", i, y[i], want[i])
		}
	}
	return nil
}

// TestNewPoolWorkersBound: more workers than MaxWorkers is an error that
// names the option, the value and the bound.
func TestNewPoolWorkersBound(t *testing.T) {
	p, err := NewPool(Options{Workers: MaxWorkers + 1})
	if err == nil {
		p.Close()
		t.Fatalf("NewPool(Workers: %d) succeeded, want an error", MaxWorkers+1)
	}
	for _, want := range []string{"Options.Workers", fmt.Sprint(MaxWorkers + 1), fmt.Sprint(MaxWorkers)} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("NewPool(Workers: %d): %q does not name %q", MaxWorkers+1, err, want)
		}
	}
}

// Command asmgen writes the assembly of the decoder's matrix kernels for
// amd64 with avo: ../../kernel_amd64.s and its Go declarations
// ../../kernel_amd64_stubs.go. Run it through go generate in
// decoder/kernels:
//
//	cd decoder/kernels && go generate
//
// It is its own module so that avo is a dependency of this generator only,
// never of zinf: the generated files are committed and build with nothing
// but the Go toolchain.
//
// Every f32 and bf16 kernel computes, for a run of columns of one row of
// weights and one to four vectors, exactly what the scalar reference
// (rowF32Scalar, rowBF16Scalar in ../../scalar.go) computes: partial sum
// j (of 16) takes columns c ≡ j mod 16, each step a fused multiply-add
// rounded once (VFMADD231PS, as FMA32), the weights widened exactly (bf16
// by a shift). The block formats' kernels (genQ) multiply with vectors
// quantized to 8-bit blocks in integers, into 8 partial sums, as
// rowQ8Scalar and rowQ4Scalar do. Two YMM registers hold
// the 16 partial sums of a vector; they are loaded from and stored back to
// memory, so that a row can be taken in column tiles, and the caller
// reduces them in the fixed tree of reduce16, with reduceAVX2 here. The
// memory-read kernel (sumF32AVX2) reduces its own sums in that tree with
// shuffles.
//
// -mutate NAME builds one deliberate deviation into the kernels, for
// mutants.sh to show that the differential tests catch it; -mutate list
// prints the names.
package main

import (
	"flag"
	"fmt"
	"os"
	"slices"
	"strings"

	. "github.com/mmcloughlin/avo/build"
	. "github.com/mmcloughlin/avo/operand"
	. "github.com/mmcloughlin/avo/reg"
)

// maxNB is the number of vectors one kernel call serves: 2 accumulators
// each, plus the weights and constants, in AVX2's 16 vector registers.
const maxNB = 4

// dtype describes one weight format's inner loop.
type dtype struct {
	name  string
	cols  int // columns per loop iteration
	wstep int // weight bytes per loop iteration
	// load widens the weights of the iteration's 16 columns into two
	// vectors (lanes 0-7, 8-15).
	load func(w Register) (VecVirtual, VecVirtual)
	// ahead, if positive, has the kernels of several vectors prefetch
	// each row's weights that many bytes on into the second level cache
	// (see gen).
	ahead int
}

// mutations are the deviations -mutate can build in, each one a mistake a
// hand-written kernel could make.
var mutations = []string{
	"unfused",                // VMULPS and VADDPS for VFMADD231PS: two roundings
	"acc-not-loaded",         // partial sums restarted at zero: the column tiles lost
	"acc-stride-32",          // vector b's partial sums stored at the wrong place
	"q4-nibbles-swapped",     // high nibbles for columns 0-15
	"q4-no-offset",           // nibbles without the offset 8
	"q-sign-dropped",         // the vector's quants multiplied with |w|, not w
	"q-x-scale-ignored",      // the weights' scale alone, not times the vector's
	"q-lanes-pairs",          // partial sums of 2 columns (VPMADDUBSW's pairs) summed in another grouping
	"bf16-shift-15",          // bf16 widened by a 15-bit shift
	"drops-last-step",        // one loop iteration too few
	"x-stride-ignored",       // every vector read at the first vector's address
	"row-stride-ignored",     // every row of a multi-row kernel read at the first row's address
	"group-acc-not-advanced", // every group of rows summed into the first group's partial sums
	"quant-nan-kept",         // the activations' quantizer lets a NaN through to the rounding
	"quant-truncates",        // the activations' quantizer truncates instead of rounding
	"quant-scale-unrounded",  // the activations' scale stored without its binary16 rounding
	"reduce-tree-halves",     // the reduction's first step pairs p[j] with p[j+4], not p[j+8]
	"reduce-row-stride",      // every row reduced from the first row's partial sums
	// The in-out kernels' own (the row kernels are left as they are).
	"io-unfused",          // VMULPS and VADDPS for VFMADD231PS
	"io-acc-not-loaded",   // the outputs' sums restarted at zero in every row block
	"io-x-not-advanced",   // every row multiplied with the vector's first value
	"io-row-stride-32",    // the next row read 32 bytes on, not a row on
	"io-y-stride-ignored", // every vector's sums stored at the first vector's place
	"io-drops-last-row",   // one row too few
	"io-bf16-shift-15",    // bf16 widened by a 15-bit shift
	"io-lanes-swapped",    // the two halves of a 16-column group exchanged
}

// mutation is the deviation being built in ("" for none).
var mutation string

func main() {
	flag.StringVar(&mutation, "mutate", "", "build the named deviation into the kernels (list: print the names)")
	neonOut := flag.String("neon", "", "write the arm64 NEON kernels to `file` (and not the amd64 ones)")
	neonStubs := flag.String("neonstubs", "", "write the NEON kernels' Go declarations to `file`")
	neonMutate := flag.String("neon-mutate", "", "build the named deviation into the NEON kernels (list: print the names)")
	flag.Parse() // avo registers its flags (-out, -stubs, -pkg) on the same set
	if *neonMutate == "list" {
		fmt.Println(strings.Join(neonMutations, "\n"))
		return
	}
	if *neonOut != "" || *neonStubs != "" {
		if err := writeNEONKernels(*neonOut, *neonStubs, *neonMutate); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(2)
		}
		return
	}
	if mutation == "list" {
		fmt.Println(strings.Join(mutations, "\n"))
		return
	}
	if mutation != "" && !slices.Contains(mutations, mutation) {
		fmt.Fprintf(os.Stderr, "asmgen: unknown mutation %q (-mutate list prints them)\n", mutation)
		os.Exit(2)
	}
	ConstraintExpr("amd64")
	// The f32 kernels of two to four vectors prefetch 8 KiB ahead (into
	// the second level cache, PREFETCHT1): their fused multiply-adds (8 a
	// cache line at four vectors) wait for the weights in the scheduler,
	// which then holds few enough cache lines that the reads from memory
	// no longer overlap as at one vector. On the 400 M llama's shapes
	// (BenchmarkLayerProducts/f32/batch=4/shared, one core) 61.7, 64.1,
	// 54.0, 56.4 ms without, 53.8, 48.2, 49.0, 50.9 with PREFETCHT0 1 KiB
	// ahead (2 and 4 KiB the same), and then 47.4, 45.7, 45.7 against
	// 29.9, 36.5, 32.0 with PREFETCHT1 4 KiB ahead, 30.8, 29.5, 25.8 8 KiB
	// ahead. At one vector any prefetch made it slower.
	f32 := dtype{name: "F32", cols: 16, wstep: 64, ahead: 8192,
		load: func(w Register) (VecVirtual, VecVirtual) {
			a, b := YMM(), YMM()
			VMOVUPS(Mem{Base: w}, a)
			VMOVUPS(Mem{Base: w, Disp: 32}, b)
			return a, b
		}}
	// No prefetch for bf16 (nor f32): one row after the other is one
	// sequential stream the hardware follows, and prefetching the next
	// row made BenchmarkDecodeStep/outin/bf16/batch1 slower in 4 pairs
	// of 4 (6.1, 5.0, 7.9, 5.4 ms with it, 4.8, 4.4, 5.0, 5.2 without).
	// Its kernels of two to four vectors prefetch ahead as f32's:
	// BenchmarkLayerProducts/bf16/batch=4/shared on one core 56.1, 35.8,
	// 36.5, 33.4 ms without, 35.0, 24.7, 25.7, 25.0 with PREFETCHT0 1 KiB
	// ahead (at one vector slower in 3 pairs of 4), then 26.6, 25.1, 25.0
	// against 19.9, 20.0, 19.9 with PREFETCHT1 8 KiB ahead (at one vector
	// slower in 3 of 3).
	bf16 := dtype{name: "BF16", cols: 16, wstep: 32, ahead: 8192,
		load: func(w Register) (VecVirtual, VecVirtual) {
			a, b := YMM(), YMM()
			VPMOVZXWD(Mem{Base: w}, a)
			VPMOVZXWD(Mem{Base: w, Disp: 16}, b)
			shift := U8(16)
			if mutation == "bf16-shift-15" {
				shift = U8(15)
			}
			VPSLLD(shift, a, a)
			VPSLLD(shift, b, b)
			return a, b
		}}
	for _, t := range []dtype{f32, bf16} {
		for nb := 1; nb <= maxNB; nb++ {
			for _, rows := range rowsOf(t, nb) {
				genRow(t, nb, rows)
			}
		}
	}
	for _, t := range []string{"Q8_0", "Q4_0"} {
		for nb := 1; nb <= maxNB; nb++ {
			genQ(t, nb)
		}
	}
	gen() // the memory-read kernel
	genReduce()
	genQuantize()
	for _, t := range []ioType{{"F32", 4}, {"BF16", 2}} {
		for nb := 1; nb <= maxNB; nb++ {
			for _, width := range ioWidths[nb] {
				genInOut(t, nb, width)
			}
		}
	}
	Generate()
}

// halfScale loads the little-endian binary16 at w and returns it widened
// (exactly) to binary32 in every lane of a YMM register.
func halfScale(w Register) VecVirtual {
	h := XMM()
	VPBROADCASTW(Mem{Base: w}, h)
	d := YMM()
	VCVTPH2PS(h, d)
	return d
}

// byteConst returns a YMM register with every byte set to v.
func byteConst(v byte) VecVirtual {
	r := GP32()
	MOVL(U32(uint32(v)*0x01010101), r)
	x := XMM()
	VMOVD(r, x)
	y := YMM()
	VPBROADCASTD(x, y)
	return y
}

// accRowBytes is the distance between two rows' partial sums at acc:
// MaxBatch vectors of 16 float32 (accs in ../../scalar.go).
const accRowBytes = 8 * 64

// rowsFor lists, per number of vectors, the numbers of rows an F32
// kernel takes at once. A vector's 16 partial sums are only two chains of
// dependent fused multiply-adds; more rows give the CPU more independent
// chains while the accumulators (2 * rows * vectors) still fit the 16
// registers with the weights, the scale and the nibble constants. One
// vector takes one row at a time all the same: from memory, a decoding
// step's rows read one after the other are one sequential stream, four
// read side by side four short ones, and on the 400 M llama's layer
// shapes (BenchmarkLayerProducts/f32/batch=1/shared, one core, load
// 2-3) the four-row kernel took 24.2, 24.4, 29.3 ms where one row took
// 20.5, 22.1, 19.6 ms; two cores agreed in 3 pairs of 4. Its two chains
// still read 16 bytes a cycle, above any memory's pace per core.
var rowsFor = map[int][]int{1: {1}, 2: {1, 2}, 3: {1}, 4: {1}}

// rowsOf returns the numbers of rows t's kernels for nb vectors take at
// once: rowsFor's for F32, one row for the narrower formats. Their rows
// are short streams (a BF16 row of 1024 columns is 2 KiB, a Q8_0 one
// 1088 bytes) that a product reads from memory: rows read side by side
// are as many short streams, one row at a time is one long stream
// through the matrix, and at one vector (a decoding step) a core read
// BF16 weights about a quarter faster so, Q8_0 ones about a twentieth
// (decoder-shaped products from memory, CPU time per byte).
func rowsOf(t dtype, nb int) []int {
	if t.name == "F32" {
		return rowsFor[nb]
	}
	return []int{1}
}

// gen emits sumF32AVX2(w *byte, n int) float32, the memory-read
// kernel: the 16-lane sum of n float32 values (n a positive multiple of
// 16), reduced in the tree of reduce16.
func gen() {
	name := "sumF32AVX2"
	TEXT(name, NOSPLIT, "func(w *byte, n int) float32")
	Pragma("noescape")
	Doc(name + " returns the sum of the n float32 values at w (n a positive multiple of 16) in the 16-lane order of the row kernels: the memory-read kernel the benchmarks measure the machine's bandwidth with.")
	n := Load(Param("n"), GP64())
	w := Load(Param("w"), GP64())
	a, c := YMM(), YMM()
	VXORPS(a, a, a)
	VXORPS(c, c, c)
	CMPQ(n, U8(0))
	JLE(LabelRef(name + "_store"))
	Label(name + "_loop")
	VADDPS(Mem{Base: w}, a, a)
	VADDPS(Mem{Base: w, Disp: 32}, c, c)
	ADDQ(U32(64), w)
	SUBQ(U32(16), n)
	JG(LabelRef(name + "_loop"))

	Label(name + "_store")
	Comment("The reduction tree of reduce16.")
	s := a
	VADDPS(c, s, s) // s8[j] = acc[j] + acc[j+8]
	hi := XMM()
	VEXTRACTF128(U8(1), s, hi)
	s4 := XMM()
	VADDPS(hi, s.AsX(), s4) // s4[j] = s8[j] + s8[j+4]
	t2 := XMM()
	VMOVHLPS(s4, s4, t2)
	VADDPS(t2, s4, s4) // s2[j] = s4[j] + s4[j+2]
	t1 := XMM()
	VMOVSHDUP(s4, t1)
	VADDSS(t1, s4, s4) // s2[0] + s2[1]
	Store(s4, ReturnIndex(0))
	VZEROUPPER()
	RET()
}

// genRow emits row<T>AVX2x<nb>r<R>(w *byte, wstride int, x *float32,
// xstride, n int, acc *float32, groups int): for groups groups of R rows
// of weights, one after the other (row r at w + r*wstride bytes, n
// weights each from there, n a positive multiple of the type's columns
// per iteration) and nb vectors (vector b at x + b*xstride bytes), it
// adds the products into the 16 partial sums of row r and vector b at
// acc + r*accRowBytes + 64*b bytes. The loop over the rows is here
// rather than in Go: a call a row cost a tenth of a decoding step's
// products at one vector.
func genRow(t dtype, nb, rows int) {
	name := fmt.Sprintf("row%sAVX2x%dr%d", t.name, nb, rows)
	TEXT(name, NOSPLIT, "func(w *byte, wstride int, x *float32, xstride, n int, acc *float32, groups int)")
	Pragma("noescape")
	Doc(fmt.Sprintf("%s adds the products of n %s weights of groups*%d rows (row r at w + r*wstride bytes; n a positive multiple of %d) with %d vectors (vector b at x + b*xstride bytes) into the 16 partial sums of row r and vector b at acc + %d*r + 64*b bytes, in the scalar reference's order.", name, t.name, rows, t.cols, nb, accRowBytes))
	wstride := Load(Param("wstride"), GP64())
	base, left := AllocLocal(8), AllocLocal(8) // the group's first row, the groups left
	{
		w := Load(Param("w"), GP64())
		MOVQ(w, base)
		g := Load(Param("groups"), GP64())
		MOVQ(g, left)
	}
	xs := make([]Register, nb)
	{
		x := Load(Param("x"), GP64())
		stride := Load(Param("xstride"), GP64())
		for b := range nb {
			xs[b] = GP64()
			switch {
			case b == 0:
				MOVQ(x, xs[b])
			case mutation == "x-stride-ignored":
				MOVQ(xs[b-1], xs[b])
			default:
				LEAQ(Mem{Base: xs[b-1], Index: stride, Scale: 1}, xs[b])
			}
		}
	}
	accp := Load(Param("acc"), GP64())
	n, i := GP64(), GP64() // columns left, byte offset into the vectors
	ws := make([]Register, rows)
	for r := range rows {
		ws[r] = GP64()
	}
	accA, accB := make([][]VecVirtual, rows), make([][]VecVirtual, rows)
	for r := range rows {
		accA[r], accB[r] = make([]VecVirtual, nb), make([]VecVirtual, nb)
		for b := range nb {
			accA[r][b], accB[r][b] = YMM(), YMM()
		}
	}
	at := func(r, b int) int { return accRowBytes*r + 64*b }

	Label(name + "_group")
	MOVQ(base, ws[0])
	for r := 1; r < rows; r++ {
		if mutation == "row-stride-ignored" {
			MOVQ(ws[r-1], ws[r])
		} else {
			LEAQ(Mem{Base: ws[r-1], Index: wstride, Scale: 1}, ws[r])
		}
	}
	Load(Param("n"), n)
	Comment("Two accumulators a row and vector: partial sums 0-7 and 8-15.")
	for r := range rows {
		for b := range nb {
			a, c := accA[r][b], accB[r][b]
			if mutation == "acc-not-loaded" {
				VXORPS(a, a, a)
				VXORPS(c, c, c)
			} else {
				VMOVUPS(Mem{Base: accp, Disp: at(r, b)}, a)
				VMOVUPS(Mem{Base: accp, Disp: at(r, b) + 32}, c)
			}
		}
	}
	XORQ(i, i)
	if mutation == "drops-last-step" {
		SUBQ(U32(t.cols), n)
	}
	CMPQ(n, U8(0))
	JLE(LabelRef(name + "_store"))
	Label(name + "_loop")
	for r := range rows {
		if nb > 1 && t.ahead > 0 {
			PREFETCHT1(Mem{Base: ws[r], Disp: t.ahead})
		}
		for h := 0; h < t.cols; h += 16 {
			wa, wb := t.load(ws[r])
			for b := range nb {
				xa := Mem{Base: xs[b], Index: i, Scale: 1, Disp: 4 * h}
				xb := Mem{Base: xs[b], Index: i, Scale: 1, Disp: 4*h + 32}
				if mutation == "unfused" {
					for _, p := range [][3]Op{{xa, wa, accA[r][b]}, {xb, wb, accB[r][b]}} {
						t := YMM()
						VMULPS(p[0], p[1], t)
						VADDPS(t, p[2], p[2])
					}
					continue
				}
				VFMADD231PS(xa, wa, accA[r][b])
				VFMADD231PS(xb, wb, accB[r][b])
			}
		}
	}
	for r := range rows {
		ADDQ(U32(t.wstep), ws[r])
	}
	ADDQ(U32(4*t.cols), i)
	SUBQ(U32(t.cols), n)
	JG(LabelRef(name + "_loop"))

	Label(name + "_store")
	Comment("Store the partial sums; the caller reduces them (reduce16).")
	for r := range rows {
		for b := range nb {
			disp := at(r, b)
			if mutation == "acc-stride-32" {
				disp = accRowBytes*r + 32*b
			}
			VMOVUPS(accA[r][b], Mem{Base: accp, Disp: disp})
			VMOVUPS(accB[r][b], Mem{Base: accp, Disp: disp + 32})
		}
	}
	Comment("The next group of rows.")
	MOVQ(base, ws[0])
	LEAQ(Mem{Base: ws[0], Index: wstride, Scale: uint8(rows)}, ws[0])
	MOVQ(ws[0], base)
	if mutation != "group-acc-not-advanced" {
		ADDQ(U32(rows*accRowBytes), accp)
	}
	DECQ(left)
	JG(LabelRef(name + "_group"))
	VZEROUPPER()
	RET()
}

// genReduce emits reduceAVX2(acc *float32, stride, rows int, y *float32):
// for rows rows (rows ≥ 1) of 16 partial sums (row r's at acc +
// r*stride bytes), y[r] = the fixed tree of reduce16 over them. The
// products reduce a block's rows here rather than in Go: the sums were
// just stored by a row kernel as 32-byte vectors, which the CPU forwards
// to 32-byte loads of the same addresses but not to the scalar loads of
// reduce16, and the tree takes half a dozen vector instructions a row.
func genReduce() {
	name := "reduceAVX2"
	TEXT(name, NOSPLIT, "func(acc *float32, stride, rows int, y *float32)")
	Pragma("noescape")
	Doc(name + " sets y[r] for r < rows (rows ≥ 1) to the sum of the 16 partial sums at acc + r*stride bytes in the fixed tree of reduce16.")
	acc := Load(Param("acc"), GP64())
	stride := Load(Param("stride"), GP64())
	rows := Load(Param("rows"), GP64())
	y := Load(Param("y"), GP64())
	if mutation == "reduce-row-stride" {
		XORQ(stride, stride)
	}
	Label(name + "_loop")
	s := YMM()
	VMOVUPS(Mem{Base: acc}, s)
	if mutation == "reduce-tree-halves" {
		// p[j] + p[j+4] within each half: a different tree.
		t := YMM()
		VPERMILPS(U8(0x4e), s, t)
		VADDPS(t, s, s)
		VADDPS(Mem{Base: acc, Disp: 32}, s, s)
	} else {
		VADDPS(Mem{Base: acc, Disp: 32}, s, s) // s8[j] = p[j] + p[j+8]
	}
	hi := XMM()
	VEXTRACTF128(U8(1), s, hi)
	s4 := XMM()
	VADDPS(hi, s.AsX(), s4) // s4[j] = s8[j] + s8[j+4]
	t2 := XMM()
	VMOVHLPS(s4, s4, t2)
	VADDPS(t2, s4, s4) // s2[j] = s4[j] + s4[j+2]
	t1 := XMM()
	VMOVSHDUP(s4, t1)
	VADDSS(t1, s4, s4) // s2[0] + s2[1]
	VMOVSS(s4, Mem{Base: y})
	ADDQ(stride, acc)
	ADDQ(U8(4), y)
	DECQ(rows)
	JG(LabelRef(name + "_loop"))
	VZEROUPPER()
	RET()
}

// ioType is a weight format of the in-out kernels: its name and bytes a
// value.
type ioType struct {
	name  string
	bytes int
}

// ioWidths lists, per number of vectors, the output columns an in-out
// kernel takes at once: the widest whose sums (width/8 registers per
// vector) fit AVX2's 16 registers with the weights and the broadcast
// inputs, and 8 for the columns past the last wide tile.
var ioWidths = map[int][]int{1: {64, 8}, 2: {32, 8}, 3: {16, 8}, 4: {16, 8}}

// genInOut emits inout<T>AVX2x<nb>w<W>(w *byte, wstride int, x *float32,
// xstride, rows int, y *float32, ystride, n int): for n output columns
// (n a positive multiple of W) of rows rows (rows ≥ 1) of an in-out
// matrix (row i, an input feature, at w + i*wstride bytes) and nb
// vectors (vector b's inputs for those rows at x + b*xstride bytes), it
// adds, row after row, x[b][i] * W[i][c] into the sum of output c of
// vector b at y + b*ystride + 4c bytes, each a fused multiply-add rounded
// once: the scalar reference's order (inOutScalar), which takes every
// output's rows in increasing order. It goes through the columns W at a
// time, the W sums of each vector in registers while the rows pass; the
// sums are loaded from y and stored back, so that the caller can take the
// rows in blocks.
func genInOut(t ioType, nb, width int) {
	name := fmt.Sprintf("inout%sAVX2x%dw%d", t.name, nb, width)
	TEXT(name, NOSPLIT, "func(w *byte, wstride int, x *float32, xstride, rows int, y *float32, ystride, n int)")
	Pragma("noescape")
	Doc(fmt.Sprintf("%s adds, for rows rows of an in-out %s matrix (row i at w + i*wstride bytes) and %d vectors (vector b's inputs at x + b*xstride bytes), x[b][i] * W[i][c] into the sums of the n outputs c of vector b at y + b*ystride bytes (n a positive multiple of %d), row after row, one fused multiply-add each: the order of the scalar reference inOutScalar.", name, t.name, nb, width))
	rows4 := Load(Param("rows"), GP64())
	SHLQ(U8(2), rows4) // the byte offset past the last row's input
	if mutation == "io-drops-last-row" {
		SUBQ(U8(4), rows4)
	}
	n := Load(Param("n"), GP64())
	wt := Load(Param("w"), GP64())
	wstride := Load(Param("wstride"), GP64())
	if mutation == "io-row-stride-32" {
		MOVQ(U32(32), wstride)
	}
	xs, ys := make([]Register, nb), make([]Register, nb)
	{
		x := Load(Param("x"), GP64())
		xstride := Load(Param("xstride"), GP64())
		y := Load(Param("y"), GP64())
		ystride := Load(Param("ystride"), GP64())
		if mutation == "io-y-stride-ignored" {
			XORQ(ystride, ystride)
		}
		xs[0], ys[0] = x, y
		for b := 1; b < nb; b++ {
			xs[b], ys[b] = GP64(), GP64()
			LEAQ(Mem{Base: xs[b-1], Index: xstride, Scale: 1}, xs[b])
			LEAQ(Mem{Base: ys[b-1], Index: ystride, Scale: 1}, ys[b])
		}
	}
	regs := width / 8
	acc := make([][]VecVirtual, nb)
	for b := range nb {
		acc[b] = make([]VecVirtual, regs)
		for k := range regs {
			acc[b][k] = YMM()
		}
	}
	wp, i := GP64(), GP64()
	Label(name + "_tile")
	Comment("The tile's sums, 8 outputs to a register.")
	for b := range nb {
		for k := range regs {
			if mutation == "io-acc-not-loaded" {
				VXORPS(acc[b][k], acc[b][k], acc[b][k])
			} else {
				VMOVUPS(Mem{Base: ys[b], Disp: 32 * k}, acc[b][k])
			}
		}
	}
	MOVQ(wt, wp)
	XORQ(i, i)
	Label(name + "_row")
	xb := make([]VecVirtual, nb)
	for b := range nb {
		xb[b] = YMM()
		if mutation == "io-x-not-advanced" {
			VBROADCASTSS(Mem{Base: xs[b]}, xb[b])
		} else {
			VBROADCASTSS(Mem{Base: xs[b], Index: i, Scale: 1}, xb[b])
		}
	}
	// load returns the weights of columns [8k, 8k+8) widened to float32,
	// or the memory operand f32 weights are multiplied from directly.
	load := func(k int) Op {
		kk := k
		if mutation == "io-lanes-swapped" && regs >= 2 {
			kk = k ^ 1
		}
		switch t.name {
		case "F32":
			m := Mem{Base: wp, Disp: 32 * kk}
			if nb == 1 {
				return m
			}
			v := YMM()
			VMOVUPS(m, v)
			return v
		default: // BF16
			v := YMM()
			VPMOVZXWD(Mem{Base: wp, Disp: 16 * kk}, v)
			shift := U8(16)
			if mutation == "io-bf16-shift-15" {
				shift = U8(15)
			}
			VPSLLD(shift, v, v)
			return v
		}
	}
	for k := range regs {
		wv := load(k)
		for b := range nb {
			if mutation == "io-unfused" {
				p := YMM()
				VMULPS(wv, xb[b], p)
				VADDPS(p, acc[b][k], acc[b][k])
				continue
			}
			VFMADD231PS(wv, xb[b], acc[b][k])
		}
	}
	ADDQ(wstride, wp)
	ADDQ(U8(4), i)
	CMPQ(i, rows4)
	JL(LabelRef(name + "_row"))

	for b := range nb {
		for k := range regs {
			VMOVUPS(acc[b][k], Mem{Base: ys[b], Disp: 32 * k})
		}
		ADDQ(U32(4*width), ys[b])
	}
	ADDQ(U32(t.bytes*width), wt)
	SUBQ(U32(width), n)
	JG(LabelRef(name + "_tile"))
	VZEROUPPER()
	RET()
}

// genQ emits dot<T>AVX2x<nb>(w *byte, wstride int, qx *byte, xd
// *float32, xstride, dstride, n int, acc *float32): for one row of n
// weights of the block format t (Q8_0 or Q4_0; n a positive multiple of
// 32) and nb vectors quantized to blocks of 8-bit integers (vector b's
// quants at qx + b*xstride bytes, its blocks' binary32 scales at xd +
// b*dstride bytes), it adds into partial sums 0-7 of vector b at acc +
// 64*b bytes, block after block, the integer dot products of columns
// 4j..4j+3 (VPSIGNB moves the weights' signs onto the vector's quants,
// VPMADDUBSW multiplies those with |w| and adds pairs, exactly: |w| ≤
// 128 and |x| ≤ 127, VPMADDWD adds the pairs' pairs) converted to
// binary32 (exact) times the product of the two scales (exact), one fused
// multiply-add each: the order of the scalar reference (rowQ8Scalar,
// rowQ4Scalar). It prefetches the next row (wstride bytes on) at the
// columns it reads when it serves more than one vector.
func genQ(t string, nb int) {
	name := fmt.Sprintf("dot%sAVX2x%d", t, nb)
	TEXT(name, NOSPLIT, "func(w *byte, wstride int, qx *byte, xd *float32, xstride, dstride, n int, acc *float32, rows int)")
	Pragma("noescape")
	Doc(fmt.Sprintf("%s adds the products of n %s weights of each of rows rows (row r at w + r*wstride bytes; n a positive multiple of 32) with %d vectors quantized to 8-bit blocks (vector b's quants at qx + b*xstride bytes, its blocks' scales at xd + b*dstride bytes) into partial sums 0-7 of row r and vector b at acc + %d*r + 64*b bytes, in the scalar reference's order.", name, t, nb, accRowBytes))
	n, w := GP64(), GP64()
	pf := Load(Param("wstride"), GP64())
	base, left := AllocLocal(8), AllocLocal(8) // the row, the rows left
	{
		w0 := Load(Param("w"), GP64())
		MOVQ(w0, base)
		r := Load(Param("rows"), GP64())
		MOVQ(r, left)
	}
	xs, ds := make([]Register, nb), make([]Register, nb)
	{
		x := Load(Param("qx"), GP64())
		d := Load(Param("xd"), GP64())
		xstride := Load(Param("xstride"), GP64())
		dstride := Load(Param("dstride"), GP64())
		if mutation == "x-stride-ignored" {
			XORQ(xstride, xstride)
			XORQ(dstride, dstride)
		}
		xs[0], ds[0] = x, d
		for b := 1; b < nb; b++ {
			xs[b], ds[b] = GP64(), GP64()
			LEAQ(Mem{Base: xs[b-1], Index: xstride, Scale: 1}, xs[b])
			LEAQ(Mem{Base: ds[b-1], Index: dstride, Scale: 1}, ds[b])
		}
	}
	ones := YMM() // sixteen int16 ones, for VPMADDWD
	{
		r := GP32()
		MOVL(U32(0x00010001), r)
		x := XMM()
		VMOVD(r, x)
		VPBROADCASTD(x, ones)
	}
	var mask, eight VecVirtual
	if t == "Q4_0" {
		mask, eight = byteConst(0x0f), byteConst(0x08)
	}
	accp := Load(Param("acc"), GP64())
	acc := make([]VecVirtual, nb)
	for b := range nb {
		acc[b] = YMM()
	}
	i, k := GP64(), GP64() // byte offsets into the quants and the scales

	Label(name + "_row")
	MOVQ(base, w)
	Load(Param("n"), n)
	Comment("One accumulator a vector: partial sums 0-7.")
	for b := range nb {
		if mutation == "acc-not-loaded" {
			VXORPS(acc[b], acc[b], acc[b])
		} else {
			VMOVUPS(Mem{Base: accp, Disp: 64 * b}, acc[b])
		}
	}
	XORQ(i, i)
	XORQ(k, k)
	if mutation == "drops-last-step" {
		SUBQ(U32(32), n)
	}
	CMPQ(n, U8(0))
	JLE(LabelRef(name + "_store"))
	Label(name + "_loop")
	if nb > 1 {
		// One vector reads a row after the other, one stream: the
		// prefetch made it slower (BenchmarkLayerProducts/q8_0/batch=1/
		// shared on one core: 6.50, 6.75, 6.75, 6.55 ms with it, 6.46,
		// 6.28, 6.44, 6.57 without); four vectors were faster with it
		// (16.4, 16.0, 16.1, 16.3 against 18.4, 18.2, 18.4, 18.7 ms).
		PREFETCHT0(Mem{Base: w, Index: pf, Scale: 1})
	}
	dw := halfScale(w)
	q := YMM()
	if t == "Q8_0" {
		VMOVDQU(Mem{Base: w, Disp: 2}, q)
	} else {
		// Columns [0,16) are the low nibbles of the 16 bytes, [16,32)
		// the high ones: one register of 32 bytes, nibble - 8 each.
		lo, hi := XMM(), XMM()
		VMOVDQU(Mem{Base: w, Disp: 2}, lo)
		VPSRLW(U8(4), lo, hi)
		if mutation == "q4-nibbles-swapped" {
			lo, hi = hi, lo
		}
		VINSERTI128(U8(1), hi, lo.AsY(), q)
		VPAND(mask, q, q)
		if mutation != "q4-no-offset" {
			VPSUBB(eight, q, q)
		}
	}
	abs := YMM()
	VPSIGNB(q, q, abs) // |w|, as unsigned bytes (-128 is 128)
	for b := range nb {
		sx := YMM()
		if mutation == "q-sign-dropped" {
			VMOVDQU(Mem{Base: xs[b], Index: i, Scale: 1}, sx)
		} else {
			VMOVDQU(Mem{Base: xs[b], Index: i, Scale: 1}, sx)
			VPSIGNB(q, sx, sx) // x * sign(w)
		}
		pairs := YMM()
		VPMADDUBSW(sx, abs, pairs)
		dots := YMM()
		if mutation == "q-lanes-pairs" {
			// Pairs of pairs two apart: another grouping of the columns.
			sh := YMM()
			VPSHUFD(U8(0xd8), pairs, sh)
			VPMADDWD(ones, sh, dots)
		} else {
			VPMADDWD(ones, pairs, dots)
		}
		VCVTDQ2PS(dots, dots)
		s := YMM()
		if mutation == "q-x-scale-ignored" {
			VMOVAPS(dw, s)
		} else {
			VBROADCASTSS(Mem{Base: ds[b], Index: k, Scale: 1}, s)
			VMULPS(dw, s, s)
		}
		if mutation == "unfused" {
			VMULPS(s, dots, dots)
			VADDPS(dots, acc[b], acc[b])
		} else {
			VFMADD231PS(s, dots, acc[b])
		}
	}
	blockBytes := map[string]int{"Q8_0": 34, "Q4_0": 18}[t]
	ADDQ(U32(blockBytes), w)
	ADDQ(U32(32), i)
	ADDQ(U32(4), k)
	SUBQ(U32(32), n)
	JG(LabelRef(name + "_loop"))

	Label(name + "_store")
	Comment("Store the partial sums; the caller reduces them (reduce16, partial sums 8-15 zero).")
	for b := range nb {
		disp := 64 * b
		if mutation == "acc-stride-32" {
			disp = 32 * b
		}
		VMOVUPS(acc[b], Mem{Base: accp, Disp: disp})
	}
	Comment("The next row.")
	MOVQ(base, w)
	ADDQ(pf, w)
	MOVQ(w, base)
	if mutation != "group-acc-not-advanced" {
		ADDQ(U32(accRowBytes), accp)
	}
	DECQ(left)
	JG(LabelRef(name + "_row"))
	VZEROUPPER()
	RET()
}

// genQuantize emits quantizeActsAVX2(x *float32, n int, qx *byte, xd
// *float32): the n values at x (n a positive multiple of 32) quantized
// to blocks of 32 8-bit integers as quantizeActs does (../../scalar.go),
// bit for bit: amax by the integer maximum of the magnitudes' bits (a
// NaN's lie above every number's, so a NaN makes amax a NaN as there),
// the scale amax/127 rounded to binary16 and back (VCVTPS2PH,
// VCVTPH2PS), id = 127/amax (0 when amax is 0), each x*id with NaNs
// set to 0 and clamped to ±127, rounded to nearest even by VCVTPS2DQ
// under the default rounding mode, packed to bytes and put back in order
// (VPACKSSDW and VPACKSSWB work within 128-bit lanes).
func genQuantize() {
	name := "quantizeActsAVX2"
	TEXT(name, NOSPLIT, "func(x *float32, n int, qx *byte, xd *float32)")
	Pragma("noescape")
	Doc(name + " quantizes the n float32 values at x (n a positive multiple of 32) to blocks of 32 signed bytes at qx and their scales at xd, as quantizeActs does.")
	x := Load(Param("x"), GP64())
	n := Load(Param("n"), GP64())
	qx := Load(Param("qx"), GP64())
	xd := Load(Param("xd"), GP64())
	c := func(name string, v []uint32) Mem {
		m := GLOBL(name, RODATA|NOPTR)
		for i := range 8 {
			DATA(4*i, U32(v[i%len(v)]))
		}
		return m
	}
	absMask := c("qabs", []uint32{0x7fffffff})
	hi := c("q127", []uint32{0x42fe0000})  // 127.0
	lo := c("qm127", []uint32{0xc2fe0000}) // -127.0
	perm := c("qperm", []uint32{0, 4, 1, 5, 2, 6, 3, 7})
	Label(name + "_block")
	v := make([]VecVirtual, 4)
	m := YMM()
	for k := range 4 {
		v[k] = YMM()
		VMOVUPS(Mem{Base: x, Disp: 32 * k}, v[k])
		a := YMM()
		VANDPS(absMask, v[k], a)
		if k == 0 {
			VMOVAPS(a, m)
		} else {
			VPMAXUD(a, m, m)
		}
	}
	hx := XMM()
	VEXTRACTI128(U8(1), m, hx)
	mx := XMM()
	VPMAXUD(hx, m.AsX(), mx)
	t := XMM()
	VPSHUFD(U8(0x4e), mx, t)
	VPMAXUD(t, mx, mx)
	VPSHUFD(U8(0xb1), mx, t)
	VPMAXUD(t, mx, mx) // amax in every lane
	Comment("The scale: amax/127 rounded to binary16, widened back.")
	d := XMM()
	VDIVSS(hi, mx, d)
	if mutation != "quant-scale-unrounded" {
		h := XMM()
		VCVTPS2PH(U8(0), d, h)
		VCVTPH2PS(h, d)
	}
	VMOVSS(d, Mem{Base: xd})
	Comment("id = 127/amax, 0 where amax is 0 (a NaN where it is a NaN).")
	id := XMM()
	VMOVSS(hi, id)
	VDIVSS(mx, id, id)
	z := XMM()
	VXORPS(z, z, z)
	nz := XMM()
	VCMPSS(U8(4), z, mx, nz) // amax != 0, or unordered
	VANDPS(nz, id, id)
	idy := YMM()
	VBROADCASTSS(id, idy)
	for k := range 4 {
		VMULPS(idy, v[k], v[k])
		if mutation != "quant-nan-kept" {
			ord := YMM()
			VCMPPS(U8(7), v[k], v[k], ord) // not a NaN
			VANDPS(ord, v[k], v[k])
		}
		VMINPS(hi, v[k], v[k])
		VMAXPS(lo, v[k], v[k])
		if mutation == "quant-truncates" {
			VCVTTPS2DQ(v[k], v[k])
		} else {
			VCVTPS2DQ(v[k], v[k])
		}
	}
	w0, w1 := YMM(), YMM()
	VPACKSSDW(v[1], v[0], w0)
	VPACKSSDW(v[3], v[2], w1)
	VPACKSSWB(w1, w0, w0)
	idx := YMM()
	VMOVDQU(perm, idx)
	VPERMD(w0, idx, w0)
	VMOVDQU(w0, Mem{Base: qx})
	ADDQ(U32(128), x)
	ADDQ(U32(32), qx)
	ADDQ(U32(4), xd)
	SUBQ(U32(32), n)
	JG(LabelRef(name + "_block"))
	VZEROUPPER()
	RET()
}

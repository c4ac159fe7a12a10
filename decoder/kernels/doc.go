// Package kernels holds the arithmetic of zinf's native decoder: the
// matrix-vector and small-batch matrix products of a decoder-only
// transformer's linear layers, computed straight from the bytes the
// weights are stored in (zinf's pinned buffers, a mapped file), with no
// widened copy of a weight matrix and no dependency outside the Go
// toolchain.
//
// # Products
//
// MatMul (on a shared pool) and Pool.MatMul compute
//
//	y[b*Rows + r] = sum over c of W[r][c] * x[b*Cols + c]
//
// for 1 to MaxBatch (8) vectors x at once: W is row-major, Rows x Cols,
// as Hugging Face and GGUF store a linear layer's weight (out features by
// in features); x and y are float32. A weight's bytes are read from memory
// once for the whole batch: the kernels serve up to four vectors in one
// pass, and a batch of five to eight takes the same bytes a second time
// from the cache. Rows go through the columns in tiles, eight rows at a
// time, each tile sized so that the batch's part of the vectors (8 KiB at
// most) stays in the first level cache while the rows' weights stream
// past it; the partial sums carry over from tile to tile, so the tiles
// leave the order below unchanged. The rows are cut into contiguous
// ranges (up to four a worker) that a bounded set of goroutines
// (GOMAXPROCS by default, Options.Workers otherwise, the caller's among
// them) take from a shared counter, so that a goroutine slowed by other
// work on its core takes fewer; a product allocates nothing once its
// pool runs. Idle workers poll for the next product for 200 µs, yielding
// the processor every 64 polls, before they sleep, and a product's
// caller polls for its workers' chunks: waking a sleeping goroutine cost
// as much as a decoder's 1024 x 1024 product. Shapes are checked before
// anything is computed: a wrong length, a
// dimension outside 0..MaxDim, a block format's column count that is not
// a multiple of 32, or an unknown type returns an error and leaves y
// untouched.
//
// # In-out products
//
// MatMulInOut (and Pool.MatMulInOut) take a matrix stored the other way
// round, in features by out features as GoMLX's dense layers store it
// (Rows inputs, Cols outputs, F32 or BF16):
//
//	y[b*Cols + c] = sum over r of x[b*Rows + r] * W[r][c]
//
// Their order is another one, also fixed: every output's sum starts at +0
// and takes the rows in increasing order, s = fma(x[r], W[r][c], s), one
// FMA32 each. The kernels keep the sums of 8 to 64 outputs of up to four
// vectors in registers while a block of 8 rows passes (each row's input
// broadcast, its weights widened and multiplied into all those sums at
// once: an axpy a row, reading the weights in the order they lie), store
// them, and go on with the next columns; a chunk takes its columns in
// spans whose sums stay in the first level cache while all the row blocks
// pass, and the columns are split into contiguous ranges (multiples of 8)
// over the workers. The columns past the last multiple of 8 run on the
// scalar reference. The bits do not depend on the kernel, the split or
// the batch (TestInOutKernelsMatchScalar), but they are not MatMul's on
// the transposed matrix. Block formats are refused: their blocks run
// along the outputs there, and no model zinf reads stores them so.
//
// # Formats
//
// A Matrix's Data holds rows back to back, RowBytes(Type, Cols) bytes
// each, in one of four types, all little-endian and needing no alignment:
//
//   - F32: IEEE 754 binary32.
//   - BF16: bfloat16, the upper half of a binary32; widened exactly by a
//     16-bit shift.
//   - Q8_0: llama.cpp's 8-bit blocks of 32 weights, 34 bytes: a binary16
//     scale d, then 32 signed bytes q; weight i is q[i]*d.
//   - Q4_0: llama.cpp's 4-bit blocks of 32 weights, 18 bytes: a binary16
//     scale d, then 16 bytes; weight i < 16 is the low nibble n of byte i,
//     weight i+16 the high nibble of byte i, each standing for (n-8)*d.
//
// Dequantize writes a block format's weights out as binary32 values
// (q*d, exact). The products do not widen them: like llama.cpp, they
// multiply a block format's weights with the vectors quantized to 8-bit
// blocks, in integers (see The accumulation order). QuantizeQ8_0 and
// QuantizeQ4_0 follow llama.cpp's reference quantizers (their doc
// comments give the rounding), so a block they write is the block
// llama.cpp writes for the same numbers, up to the scale's conversion to
// binary16, which rounds to nearest, ties to even, as F16C does.
//
// # The accumulation order
//
// Floating-point sums depend on their order, so the package defines one
// and every kernel keeps it, giving the same bits on every machine, for
// every split over workers and every batch size. For one row and one
// vector:
//
//  1. Sixteen partial sums p[0..15] start at +0. For each group of 16
//     columns c0, c0+16, ... below Cols rounded down to a multiple of 16,
//     in increasing order, p[j] = fma(w[c0+j], x[c0+j], p[j]): a fused
//     multiply-add rounded once to binary32 (FMA32). Partial sum j thus
//     takes the columns c ≡ j (mod 16).
//  2. A fixed tree reduces them: s8[j] = p[j] + p[j+8] for j < 8, s4[j] =
//     s8[j] + s8[j+4], s2[j] = s4[j] + s4[j+2], s = s2[0] + s2[1] (zero
//     when there is no whole group).
//  3. The last Cols mod 16 columns (F32 and BF16 only; the block formats
//     have none) follow one at a time: s = fma(w[c], x[c], s).
//
// The block formats (Q8_0 and Q4_0) follow another definition, as
// llama.cpp computes them: each vector is first quantized to blocks of
// 32 8-bit integers, once per product on the caller's goroutine (the
// amd64 kernels with AVX2, quantizeActsAVX2, 12 times as fast as the Go
// loop, writing the same bytes: TestQuantizeKernelsMatch): amax = max
// |x| of the block, its scale dx = amax/127 rounded to binary16, each
// quant x*(127/amax) (binary32) rounded to the nearest integer, ties to
// even, within ±127 (all zero when amax is 0). Then:
//
//  1. Eight partial sums p[0..7] start at +0 (p[8..15] stay +0). For
//     each block of the row, in increasing order, p[j] = fma(float32(s),
//     dw*dx, p[j]), where s is the integer dot product of the block's
//     columns 4j..4j+3 (the weights' quants times the vector's, exact),
//     dw the weights' scale, and dw*dx exact (two binary16
//     significands).
//  2. The tree of step 2 above over the 16 partial sums.
//
// Its result differs from the product of the dequantized weights with x
// by the vector's quantization: per block at most about (0.5/127 +
// 2^-11) * max |x| * sum |w| (half a step, and the scale's binary16
// rounding), plus a rounding bound like the one below; the tests check
// it against float64. A vector's quantization depends on that vector
// only, so batches, prefills and splits over workers still give the same
// bits. A block whose amax/127 is past binary16's range (65504) gives an
// infinity, and one whose amax is below about 2^-25*127 a scale of zero,
// as in llama.cpp.
//
// The scalar kernels (KernelScalar) are these definitions written out in
// Go, and the reference the tests hold every SIMD kernel to, bit for bit.
// The kernels compute step 1; step 3 is Go code every kernel shares, and
// step 2 is too except on amd64, where a generated kernel (reduceAVX2)
// reduces a block's rows with the same additions in vector registers, so
// that the sums the row kernels just stored as 32-byte vectors are read
// back as such (the processor forwards those stores to loads of the same
// width, not to reduce16's scalar loads). The error of a result is at most about (Cols/16 + 19) * 2^-24 times the
// sum of |w*x| (a test checks the bound against float64).
//
// # Kernels
//
// On amd64 with AVX2, FMA and F16C the products run on kernels
// generated as assembly by internal/asmgen (go generate; the .s and its
// declarations are committed). Two YMM registers hold the 16 partial sums
// of a row and vector, loaded and stored around a tile. Kernels take one
// row at a time (the f32 kernel of two vectors two): rows read side by
// side are as many short streams from memory, and one row at a time,
// one long stream, made a core read bf16 weights about a quarter faster
// at one vector, f32 ones 10-30% faster than four rows at once
// (BenchmarkLayerProducts' shapes), although a vector's partial sums are
// then only two chains of dependent fused multiply-adds. A call takes a
// row block's rows one after the other (the loop over them in the
// assembly: a Go call a row cost about a tenth of the kernels' time at
// one vector). The bf16
// weights are widened in registers by VPMOVZXWD and a shift. The block
// formats' kernels (one row, up to four vectors) take a block of 32
// weights as 32 signed bytes (Q4_0's masked nibbles less 8, the low
// nibbles, then the high ones), move the weights' signs onto the
// vector's quants (VPSIGNB), multiply those with |w| and add adjacent
// pairs (VPMADDUBSW, exact: |w| ≤ 128 and |x| ≤ 127), add pairs of those
// (VPMADDWD), convert the eight sums (VCVTDQ2PS) and add them times the
// two scales' product into one register of 8 partial sums a vector
// (VFMADD231PS): about a dozen instructions a block, where widening each
// weight to binary32 first took about three times as many and made Q8_0
// products compute-bound. The block formats'
// kernels of two to four vectors prefetch the row the next call takes
// (wstride bytes on, at the columns they read): 10% faster at four
// vectors; at one vector it was 3% slower. The f32 and bf16
// kernels do without: prefetching the next row made both slower
// (BenchmarkDecodeStep at one vector), their rows read one after the
// other being one stream the hardware follows. Their kernels of two to
// four vectors prefetch 8 KiB ahead in that stream instead, into the
// second level cache (PREFETCHT1): their fused multiply-adds waiting for
// the weights fill the scheduler, so that fewer reads from memory
// overlap than at one vector (at four vectors on one core, f32 and bf16
// took about half the time they took without it). The tests compare every kernel
// with the scalar one on random shapes, bit for bit, and
// internal/asmgen/mutants.sh builds deliberate mistakes into the assembly
// and requires the tests to catch each (the row and the in-out kernels'
// own mistakes). Pool.MatMuls takes several matrices that share the
// vectors (a layer's queries, keys and values) as one run of rows, split
// over the workers once. Dots and WeightedSum run the f32 row and in-out
// kernels on the calling goroutine over float32 rows a stride apart (a
// decoder's attention over its KV cache), with MatMul's and
// MatMulInOut's bits. Encode stores float32 values in any of the
// types, Dequantize reads them back. Kernels lists what the machine has; Options.Kernel
// picks one (for tests and benchmarks: the bits do not
// depend on it).
//
// On arm64 the products run on NEON kernels that internal/asmgen -neon
// prints as Go assembly: the f32 and bf16 ones (row and in-out) with
// FMLA on four lanes, one rounding as FMA32, bf16 widened by
// interleaving zeros below it; the block formats' with the integer dot
// products of the amd64 kernels' scheme (one row after the other in the
// assembly, up to four vectors a call, a block's 32 weights as signed
// bytes, Q4_0's nibbles masked and shifted, less 8). The ARMv8.0 kernel
// (KernelNEON) multiplies bytes into 16-bit products (SMULL, SMULL2),
// adds adjacent pairs (ADDP, at most 2*128*127 in magnitude, within 16
// bits) and pairs of those widened to 32 bits (SADDLP); on CPUs with the
// dot product instructions (ARMv8.2's FEAT_DotProd, HWCAP asimddp) a
// second kernel, KernelNEONDot, listed first, takes one SDOT for 16
// columns' four sums of four instead. Both convert the sums (SCVTF) and
// add them times the two scales' product (FMUL of the binary16 scale,
// widened by FCVT, with the vector's) into two registers of partial
// sums a vector, one FMLA each. The instructions Go's assembler does not
// know are printed as their encodings (internal/asmgen/neonenc.go,
// checked against an assembler's by its test). All of them are tested
// under qemu-aarch64 against the scalar kernels, both kernels on an
// emulated CPU with SDOT and the ARMv8.0 one also on one without it,
// with their own mutants (internal/asmgen/mutants.sh arm64, make
// test-arm64). The vectors' quantization runs in Go there.
//
// Other architectures, and amd64 without those features, use the scalar
// kernels. They are correct but far slower (two orders of magnitude on
// the benchmarks' shapes): Go has no binary32 fused multiply-add, so
// FMA32 emulates it in float64 with a rounding to odd.
//
// # Caveats
//
//   - No AVX-512 or AVX512_BF16 kernels yet: AVX-512 machines run the
//     AVX2 kernels (the same bits). An AVX512_BF16 kernel
//     (VDPBF16PS) would round differently from the exact widening and
//     would need its own documented mode.
//   - The arm64 kernels are tested under emulation only: their speed
//     has not been measured on arm64 hardware, and the block formats'
//     NEON kernels do not prefetch the next row as the amd64 ones of
//     several vectors do.
//   - NaN payloads are not part of the contract: weights or inputs that
//     are NaN or infinite give a NaN or an infinity, but which NaN may
//     differ between kernels.
//   - A batch of more than four vectors passes over each tile of a row
//     twice, the second time from the cache.
//   - The block formats' products are not those of the dequantized
//     weights with x: they take x quantized to 8-bit blocks, as
//     llama.cpp does (the bound is above). A decoder's logits on Q8_0 or
//     Q4_0 weights thus differ from those of the same weights widened to
//     f32 (by up to 2.5% of the largest logit in the decoder's tests),
//     and greedy tokens may part where two logits nearly tie.
package kernels

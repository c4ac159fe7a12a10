package optimizer

import (
	"fmt"
	"math"
	"slices"
	"sort"
	"sync"
	"unsafe"
)

// QuantMap is one of the two 256-entry dynamic quantization maps of 8-bit
// blockwise states (EncodingBlockwise8): SignedDynamicMap for exp_avg,
// UnsignedDynamicMap for exp_avg_sq. A block of values x is stored as its
// absmax a (the largest magnitude) and one code per value, the index of
// the map entry nearest to x/a; it reads back as map[code]*a.
//
// Quantization, exactly:
//
//	a    = the largest |x| of the block, taken on the bit patterns with the
//	       sign cleared (so ±0 give +0 and a NaN, if any, gives the NaN
//	       whose bits are largest: the result never depends on order)
//	d    = a, or 1 when a is 0 (an all-zero block codes every element as
//	       the zero entry and reads back as +0)
//	y    = float32(x / d)                       // correctly rounded
//	code = the number of thresholds t[j] (j = 0..254) with y >= t[j]
//
// where t[j] is the smallest float32 not below the exact midpoint of
// map[j] and map[j+1]. For every y that is not a NaN this is the index of
// the nearest entry, a tie (y exactly on a midpoint) going to the larger
// entry; -0 codes as +0. A NaN y (from a NaN or infinite block) codes as
// 255 when its sign bit is clear and 0 when set; the block then reads back
// as NaNs or infinities anyway, since its absmax is one. Dequantization is
// float32(map[code] * a), correctly rounded.
type QuantMap struct{ t *quantTable }

// SignedDynamicMap returns the signed dynamic map (bitsandbytes'
// create_dynamic_map(signed=True), its "dynamic" map for exp_avg).
func SignedDynamicMap() QuantMap { return QuantMap{&quantTables().signed} }

// UnsignedDynamicMap returns the unsigned dynamic map (bitsandbytes'
// create_dynamic_map(signed=False), its "udynamic" map for exp_avg_sq).
func UnsignedDynamicMap() QuantMap { return QuantMap{&quantTables().unsigned} }

// Values returns the map's 256 entries in ascending order.
func (q QuantMap) Values() [256]float32 { return q.t.values }

// Thresholds returns t[0..254] (see QuantMap); the last element is a NaN
// (nothing is at or above it).
func (q QuantMap) Thresholds() [256]float32 { return q.t.thr }

// Code returns the code of y, a value already divided by its block's
// absmax: the index of the entry nearest to y (see QuantMap).
func (q QuantMap) Code(y float32) uint8 { return q.t.code(y) }

// Quantize codes src blockwise (blocks of Blockwise8BlockSize elements,
// the last one possibly shorter) into codes and one absmax per block;
// codes must hold len(src) elements and absmax
// FormatBlockwise8.Blocks(len(src)), else it panics (a programming error,
// as for Adam).
func (q QuantMap) Quantize(codes []uint8, absmax []float32, src []float32) {
	n := len(src)
	blocks := int(FormatBlockwise8.Blocks(int64(n)))
	if len(codes) < n || len(absmax) < blocks {
		panic(fmt.Sprintf("optimizer.QuantMap.Quantize: %d values need %d codes and %d absmax, have %d and %d", n, n, blocks, len(codes), len(absmax)))
	}
	for b := range blocks {
		lo, hi := b*Blockwise8BlockSize, min((b+1)*Blockwise8BlockSize, n)
		absmax[b] = q.t.quantizeBlock(codes[lo:hi], src[lo:hi])
	}
}

// Dequantize writes map[code]*absmax of each element to dst, which must
// hold len(codes) elements (absmax: one per block), else it panics.
func (q QuantMap) Dequantize(dst []float32, codes []uint8, absmax []float32) {
	n := len(codes)
	blocks := int(FormatBlockwise8.Blocks(int64(n)))
	if len(dst) < n || len(absmax) < blocks {
		panic(fmt.Sprintf("optimizer.QuantMap.Dequantize: %d codes need %d values and %d absmax, have %d and %d", n, n, blocks, len(dst), len(absmax)))
	}
	for b := range blocks {
		lo, hi := b*Blockwise8BlockSize, min((b+1)*Blockwise8BlockSize, n)
		q.t.dequantizeBlock(dst[lo:hi], codes[lo:hi], absmax[b])
	}
}

// The buckets of the code lookup: a value's code is found from the top 16
// bits of its magnitude (sign, exponent and 7 mantissa bits: the bfloat16
// it truncates to), clamped to [bucketLo, bucketHi], plus one comparison
// with a threshold. The range starts at 2^-23, below every nonzero map
// entry's midpoint with zero (the smallest is about 1.6e-7), so bucket 0
// also holds zero and the subnormals; it ends at 1.0, whose bucket also
// holds everything larger, infinities and NaNs. Each bucket is one
// bfloat16 step wide (1/128 of its binade), narrower than the gap between
// any two thresholds, so it holds at most one: newQuantTable checks that.
const (
	bucketLo    = 0x3400 // top 16 bits of 2^-23
	bucketHi    = 0x3f80 // top 16 bits of 1.0
	bucketCount = bucketHi - bucketLo + 1
	// bucketBytes is the bucket table's size: the positive half, the
	// negative half, and 3 bytes of padding (the SIMD kernels read 4 bytes
	// at each byte offset and keep the low one).
	bucketBytes = (2*bucketCount + 3 + 7) &^ 7
)

// quantTable is one map with its thresholds and code buckets. The SIMD
// kernels read it through a pointer, at the offsets quantTableValues,
// quantTableThr and quantTableBucket (internal/asmgen declares the same;
// TestQuantTableLayout checks them).
type quantTable struct {
	values [256]float32
	thr    [256]float32 // thr[255] is a NaN: no comparison with it is true
	// bucket[k] (positive values) and bucket[bucketCount+k] (negative
	// ones) hold the code of the bucket's lowest value: for a negative
	// bucket, of its largest magnitude.
	bucket [bucketBytes]uint8
	// packed[k] is bucket[k] and its threshold in one word, for the SIMD
	// kernels (one gather instead of two): the code in bits 24-31 and in
	// bits 0-16 the threshold's key, where key(y) is the low 16 bits of
	// |y|, complemented for a negative y (so that within a bucket, whose
	// values share their top 16 bits, y >= t exactly when key(y) >=
	// key(t)), or 0x10000 (above every key) for a bucket without a
	// threshold. packedCode is the lookup; the tests compare it with code.
	packed [2 * bucketCount]uint32
	// wide[u] is the entry of the values whose top 16 bits are u (every
	// bucket unclamped, sign included), for the AVX2 kernel, which then
	// finds it from y's bits by one shift: the code in bits 0-7, and
	// (key-1)<<8 in the rest as an int32, where key is the threshold's key
	// of packed (0x10000 for a bucket without one). wideCode is the
	// lookup; the tests compare it with code. 256 KiB, of which a step
	// touches the entries of the magnitudes it meets: the buckets of
	// packed, as the clamped lookup reads them.
	wide [1 << 16]uint32
}

const (
	quantTableValues = 0
	quantTableThr    = 1024
	quantTableBucket = 2048
	quantTablePacked = quantTableBucket + bucketBytes
	quantTableWide   = quantTablePacked + 4*2*bucketCount
)

// wideCode is code by the wide table, as the AVX2 kernel computes it: the
// entry e of y's top 16 bits; K, the low 16 bits of y, complemented for a
// negative y (key(y) of packed), times 256; one more than e's code when K
// > e as int32s (exactly when key(y) >= the threshold's key).
func (t *quantTable) wideCode(y float32) uint8 {
	u := math.Float32bits(y)
	e := int32(t.wide[u>>16])
	sg := uint32(int32(u) >> 31)
	k := int32((u ^ sg) << 8 & 0xff_ff00)
	if k > e {
		e++
	}
	return uint8(e)
}

// packedKey is key(y) of quantTable.packed.
func packedKey(y float32) uint32 {
	u := math.Float32bits(y)
	k := u & 0xffff
	if u>>31 != 0 {
		k ^= 0xffff
	}
	return k
}

// packedCode is code by the packed table, as the SIMD kernels compute it.
func (t *quantTable) packedCode(y float32) uint8 {
	e := t.packed[bucketOf(y)]
	c := uint8(e >> 24)
	if packedKey(y) >= e&0x1_ffff {
		c++
	}
	return c
}

// bytes returns t's address as the kernels take it.
func (t *quantTable) bytes() *byte { return (*byte)(unsafe.Pointer(t)) }

// bucketOf returns the index into quantTable.bucket of y's bucket.
func bucketOf(y float32) int {
	u := math.Float32bits(y)
	k := min(max(int32(u&0x7fff_ffff>>16)-bucketLo, 0), bucketCount-1)
	if u>>31 != 0 {
		k += bucketCount
	}
	return int(k)
}

// code is the code of y: the bucket's code, plus one when y is at or
// above the one threshold the bucket may hold.
func (t *quantTable) code(y float32) uint8 {
	c := t.bucket[bucketOf(y)]
	if y >= t.thr[c] {
		c++
	}
	return c
}

// countCode is the definition code implements: the number of thresholds
// at or below y, by binary search. newQuantTable builds the buckets with
// it and the tests compare the two.
func (t *quantTable) countCode(y float32) int {
	return sort.Search(255, func(j int) bool { return !(t.thr[j] <= y) })
}

// absmaxBits is the block's absmax (QuantMap) as bits.
func absmaxBits(x []float32) uint32 {
	var m uint32
	for _, v := range x {
		m = max(m, math.Float32bits(v)&0x7fff_ffff)
	}
	return m
}

// quantizeBlock codes x (one block) into codes and returns its absmax.
func (t *quantTable) quantizeBlock(codes []uint8, x []float32) float32 {
	a := math.Float32frombits(absmaxBits(x))
	d := a
	if d == 0 {
		// Every x is ±0 and codes as the zero entry: filled without the
		// divisions (an optimizer's initial moments are such blocks).
		codes = codes[:len(x)]
		z := t.code(0)
		for i := range codes {
			codes[i] = z
		}
		return a
	}
	codes = codes[:len(x)]
	for i, v := range x {
		codes[i] = t.code(v / d)
	}
	return a
}

// dequantizeBlock writes values[code]*a for each code to dst.
func (t *quantTable) dequantizeBlock(dst []float32, codes []uint8, a float32) {
	dst = dst[:len(codes)]
	for i, c := range codes {
		dst[i] = t.values[c] * a
	}
}

// linspace32 is torch.linspace(start, end, steps) in float32 as its
// element formula defines it: step = (end-start)/(steps-1), the first
// half start + step*i, the second end - step*(steps-1-i), each operation
// rounded to float32. (torch's vectorized path computes some elements as
// base + j*step from a vector's first element instead, so the last bit of
// a few entries can differ with the CPU's vector width; this map is fixed.)
func linspace32(start, end float32, steps int) []float32 {
	out := make([]float32, steps)
	step := (end - start) / float32(steps-1)
	half := steps / 2
	for i := range out {
		if i < half {
			out[i] = start + float32(step*float32(i))
		} else {
			out[i] = end - float32(step*float32(steps-1-i))
		}
	}
	return out
}

// dynamicMap returns bitsandbytes' dynamic map (create_dynamic_map with
// its defaults: 8 bits, up to 7 exponent bits), computed in float32: for
// each decade i = 0..6, the midpoints of linspace(0.1, 1, f+1) scaled by
// float32(10^(i-6)), where f = 2^i (signed, with the negated midpoints
// too) or 2^(i+1) (unsigned); then 0 and 1, sorted. 2*(2^7-1)+2 and
// (2^8-2)+2 entries: 256 either way.
func dynamicMap(signed bool) [256]float32 {
	var data []float32
	for i := range 7 {
		f := 1 << (i + 1)
		if signed {
			f = 1 << i
		}
		b := linspace32(float32(0.1), 1, f+1)
		scale := float32(math.Pow10(i - 6)) // correctly rounded, then to float32, as torch's scalar
		for j := range f {
			mean := (b[j] + b[j+1]) / 2
			data = append(data, scale*mean)
			if signed {
				data = append(data, -scale*mean)
			}
		}
	}
	data = append(data, 0, 1)
	slices.Sort(data)
	var m [256]float32
	if copy(m[:], data) != 256 || len(data) != 256 {
		panic(fmt.Sprintf("optimizer: dynamic map has %d entries", len(data)))
	}
	return m
}

// newQuantTable builds the thresholds and buckets of map values and
// checks that every bucket holds at most one threshold (the property the
// one-comparison lookup relies on); it panics if not, which the package's
// tests would show at once (the maps are constants).
func newQuantTable(values [256]float32) quantTable {
	t := quantTable{values: values}
	for j := range 255 {
		a, b := float64(values[j]), float64(values[j+1])
		mid := (a + b) / 2 // exact: a and b are float32s of nearby magnitude
		c := float32(mid)
		if float64(c) < mid {
			c = math.Nextafter32(c, float32(math.Inf(1)))
		}
		t.thr[j] = c
	}
	t.thr[255] = float32(math.NaN())
	for k := range bucketCount {
		// The bucket's magnitudes [lo, hi].
		lo := math.Float32frombits(uint32(bucketLo+k) << 16)
		if k == 0 {
			lo = 0
		}
		hi := math.Float32frombits(uint32(bucketLo+k+1)<<16 - 1)
		if k == bucketCount-1 {
			hi = float32(math.Inf(1))
		}
		for half, r := range [2][2]float32{{lo, hi}, {-hi, -lo}} {
			c := t.countCode(r[0])
			if t.countCode(r[1]) > c+1 {
				panic(fmt.Sprintf("optimizer: quantization bucket [%g, %g] holds more than one threshold", r[0], r[1]))
			}
			t.bucket[half*bucketCount+k] = uint8(c)
			key := uint32(0x1_0000)
			if t.countCode(r[1]) > c {
				// The bucket holds t.thr[c]. The clamped end buckets take
				// values of other top bits, where keys do not order them:
				// they must hold none.
				if k == 0 || k == bucketCount-1 {
					panic(fmt.Sprintf("optimizer: quantization bucket [%g, %g] (clamped) holds a threshold", r[0], r[1]))
				}
				key = packedKey(t.thr[c])
			}
			t.packed[half*bucketCount+k] = uint32(c)<<24 | key
		}
	}
	for u := range uint32(1 << 16) {
		e := t.packed[bucketOf(math.Float32frombits(u<<16))]
		key := int32(e & 0x1_ffff)
		t.wide[u] = uint32((key-1)<<8 | int32(e>>24))
	}
	return t
}

// quantTablePair are the two maps' tables, which the 8-bit Adam kernels
// take.
type quantTablePair struct {
	signed, unsigned quantTable
}

var quantTables = sync.OnceValue(func() *quantTablePair {
	return &quantTablePair{signed: newQuantTable(dynamicMap(true)), unsigned: newQuantTable(dynamicMap(false))}
})

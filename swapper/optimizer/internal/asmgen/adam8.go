package main

import (
	"fmt"

	. "github.com/mmcloughlin/avo/build"
	. "github.com/mmcloughlin/avo/operand"
	. "github.com/mmcloughlin/avo/reg"
)

// Adam over 8-bit blockwise moments (../../adam8.go): the block size, the
// code tables' layout (quantTable in ../../quant8.go) and the scratch
// the caller passes (adam8ScratchLen float32s).
const (
	q8Block       = 256
	q8Values      = 0     // quantTableValues: the 256 map entries
	q8Thr         = 1024  // quantTableThr: the 256 thresholds
	q8Packed      = 7944  // quantTablePacked: code<<24 | threshold key, per bucket
	q8Wide        = 31504 // quantTableWide: (key-1)<<8 | code, per top 16 bits
	q8BucketLo    = 0x3400
	q8BucketCount = 0x3f80 - 0x3400 + 1
	// The scratch: the block's new exp_avg at 0, exp_avg_sq at 1024, and
	// from 2048 the constants the AVX2 kernel keeps in memory, 32 bytes
	// each.
	scrM      = 0
	scrV      = 4 * q8Block
	scrConsts = 8 * q8Block
	// The AVX2 kernel's scratch: the next block's map entries (of
	// exp_avg, of exp_avg_sq) after the new moments, then its constants.
	scrNextM      = 8 * q8Block
	scrNextV      = 12 * q8Block
	scrConstsAVX2 = 16 * q8Block
	cmpGEOQ       = 0x1d // VCMPPS: greater or equal, ordered, quiet
)

// Integer constants of the code lookup (after the argCount float ones).
const (
	icAbsMask   = argCount + iota // 0x7fffffff: clears the sign bit
	icBucketLo                    // q8BucketLo
	icBucketTop                   // q8BucketCount-1
	icBucketNeg                   // q8BucketCount: the negative half's offset
	icLow16                       // 0xffff: a key's bits
	icKeyMask                     // 0x1ffff: a packed entry's threshold key
	icZero                        // 0
	icOne                         // 1
	icShuffle                     // AVX2: each 128-bit lane's dword low bytes to its first dword
	icPerm                        // AVX2: dwords 0 and 4 to 0 and 1
	icDivM                        // AVX2: the block's exp_avg divisor (phase 2)
	icDivV                        // AVX2: the block's exp_avg_sq divisor
	icKeyBits                     // AVX2: 0xffff00, a key times 256
	icCount
)

// q8 is the state of one 8-bit kernel's generation: its ISA and where
// its constants are (a register on AVX-512, the scratch on AVX2, whose 16
// registers the update needs).
type q8 struct {
	s      isa
	consts []Op
	cbase  int // the constants' offset in the scratch (AVX2)
}

// c returns constant j as an operand: usable only as an instruction's
// first (Go order) source, the one x86 lets be in memory.
func (q *q8) c(j int) Op { return q.consts[j] }

// and, vand: integer AND of vectors (VPANDD on ZMM, VPAND on YMM).
func (q *q8) and(a, b, dst Op) {
	if q.s.masks {
		VPANDD(a, b, dst)
	} else {
		VPAND(a, b, dst)
	}
}

// genAdam8 emits adam8<ISA>(p, grad, qm, qv, am, av, blocks, args, mode,
// tm, tv, scratch): adam8Scalar on blocks whole blocks. The AVX2 kernel's
// blocks are avx2Blocks'; the AVX-512 one's, per block:
//
//  1. for each vector: dequantize exp_avg and exp_avg_sq (gather the map
//     entries of the codes, times the block's absmax), run Adam's body
//     (the operations of adamScalar, as genAdam), store the master, keep
//     the new moments in the scratch and their largest magnitudes (an
//     unsigned maximum of the bits with the sign cleared);
//  2. store the new absmax; the divisor is it, or 1.0 when it is 0;
//  3. for each vector of the scratch: y = moment/divisor, its bucket from
//     the top 16 bits of |y| (clamped; the negative half for a set sign
//     bit), the bucket's packed entry (one gather): its code, one more if
//     y's key is at or above the entry's threshold key (an integer
//     compare), the codes packed to bytes and stored.
func genAdam8(s isa) {
	name := "adam8" + s.name
	TEXT(name, NOSPLIT, fmt.Sprintf("func(p, grad *float32, qm, qv *uint8, am, av *float32, blocks int, args [%d]float32, mode int, tm, tv *byte, scratch *float32)", argCount))
	Pragma("noescape")
	Doc(fmt.Sprintf("%s runs Adam over 8-bit blockwise moments (adam8Scalar) on blocks whole blocks of %d elements, %d lanes at a time; tm and tv are the maps' quantTables, scratch holds adam8ScratchLen float32s.", name, q8Block, s.lanes))
	blocks := Load(Param("blocks"), GP64())
	mode := Load(Param("mode"), GP64())
	tm := Load(Param("tm"), GP64())
	tv := Load(Param("tv"), GP64())
	scr := Load(Param("scratch"), GP64())

	q := &q8{s: s, consts: make([]Op, icCount), cbase: scrConsts}
	if !s.masks {
		q.cbase = scrConstsAVX2
	}
	Comment("The constants: broadcast, into registers (AVX-512) or the scratch (AVX2).")
	put := func(j int, v VecVirtual) {
		if s.masks {
			q.consts[j] = v
			return
		}
		m := Mem{Base: scr, Disp: q.cbase + 32*j}
		VMOVUPS(v, m)
		q.consts[j] = m
	}
	for j := range argCount {
		put(j, broadcast(s, j))
	}
	ints := map[int]uint32{icAbsMask: 0x7fff_ffff, icBucketLo: q8BucketLo, icBucketTop: q8BucketCount - 1, icBucketNeg: q8BucketCount, icLow16: 0xffff, icKeyMask: 0x1_ffff, icZero: 0, icOne: 1}
	if !s.masks {
		ints[icKeyBits] = 0xff_ff00
	}
	for j := icAbsMask; j < icCount; j++ {
		v, ok := ints[j] // looked up in a fixed order: the output is stable
		if !ok {
			continue
		}
		r := GP32()
		MOVL(U32(v), r)
		x := s.vec()
		VMOVD(r, x.AsX())
		VPBROADCASTD(x.AsX(), x)
		put(j, x)
	}
	if !s.masks {
		// VPSHUFB: bytes 0, 4, 8, 12 of each 128-bit lane to its bytes
		// 0-3 (the rest zeroed: index bit 7 set); VPERMD: dwords 0 and 4
		// to dwords 0 and 1.
		for _, c := range []struct {
			j     int
			words [8]uint32
		}{
			{icShuffle, [8]uint32{0x0c08_0400, 0x8080_8080, 0x8080_8080, 0x8080_8080, 0x0c08_0400, 0x8080_8080, 0x8080_8080, 0x8080_8080}},
			{icPerm, [8]uint32{0, 4, 1, 1, 1, 1, 1, 1}},
		} {
			j, words := c.j, c.words
			r := GP32()
			for k, w := range words {
				MOVL(U32(w), r)
				MOVL(r, Mem{Base: scr, Disp: q.cbase + 32*j + 4*k})
			}
			q.consts[j] = Mem{Base: scr, Disp: q.cbase + 32*j}
		}
		for _, j := range []int{icDivM, icDivV} {
			q.consts[j] = Mem{Base: scr, Disp: q.cbase + 32*j}
		}
	}

	if !s.masks {
		q.avx2Blocks(name, mode, blocks, tm, tv, scr)
		return
	}
	p := Load(Param("p"), GP64())
	g := Load(Param("grad"), GP64())
	qm := Load(Param("qm"), GP64())
	qv := Load(Param("qv"), GP64())
	am := Load(Param("am"), GP64())
	av := Load(Param("av"), GP64())
	CMPQ(mode, U8(decayL2))
	JEQ(LabelRef(name + "_l2"))
	CMPQ(mode, U8(decayAdamW))
	JEQ(LabelRef(name + "_adamw"))
	args := q8Args{p, g, qm, qv, am, av, blocks, tm, tv, scr}
	q.blocks(name+"_plain", decayNone, args)
	Label(name + "_l2")
	q.blocks(name+"_l2", decayL2, args)
	Label(name + "_adamw")
	q.blocks(name+"_adamw", decayAdamW, args)
}

// q8Args are the kernel's pointer and count registers.
type q8Args struct {
	p, g, qm, qv, am, av, blocks, tm, tv, scr Register
}

// blocks emits the loop over blocks for one weight-decay mode, and the
// return.
func (q *q8) blocks(label string, mode int, a q8Args) {
	s := q.s
	Label(label + "_block")
	CMPQ(a.blocks, U8(0))
	JEQ(LabelRef(label + "_done"))

	Comment("Phase 1: dequantize, update, keep the new moments and their absmax.")
	amv, avv := s.vec(), s.vec()
	VBROADCASTSS(Mem{Base: a.am}, amv)
	VBROADCASTSS(Mem{Base: a.av}, avv)
	accM, accV := s.vec(), s.vec()
	q.zero(accM)
	q.zero(accV)
	i := GP64()
	XORQ(i, i)
	Label(label + "_update")
	q.update(mode, a, i, amv, avv, accM, accV)
	ADDQ(U8(s.lanes), i)
	CMPQ(i, U32(q8Block))
	JL(LabelRef(label + "_update"))

	Comment("Phase 2: the new absmax, stored; the divisors (1.0 for an absmax of 0).")
	divM := q.absmax(accM, Mem{Base: a.am})
	divV := q.absmax(accV, Mem{Base: a.av})

	Comment("Phase 3: requantize the block from the scratch.")
	XORQ(i, i)
	Label(label + "_quant")
	q.quantize(Mem{Base: a.scr, Index: i, Scale: 4, Disp: scrM}, divM, a.tm, Mem{Base: a.qm, Index: i, Scale: 1})
	q.quantize(Mem{Base: a.scr, Index: i, Scale: 4, Disp: scrV}, divV, a.tv, Mem{Base: a.qv, Index: i, Scale: 1})
	ADDQ(U8(s.lanes), i)
	CMPQ(i, U32(q8Block))
	JL(LabelRef(label + "_quant"))

	ADDQ(U32(4*q8Block), a.p)
	ADDQ(U32(4*q8Block), a.g)
	ADDQ(U32(q8Block), a.qm)
	ADDQ(U32(q8Block), a.qv)
	ADDQ(U8(4), a.am)
	ADDQ(U8(4), a.av)
	DECQ(a.blocks)
	JMP(LabelRef(label + "_block"))
	Label(label + "_done")
	VZEROUPPER()
	RET()
}

// zero sets v to all zeros.
func (q *q8) zero(v VecVirtual) {
	if q.s.masks {
		VPXORD(v, v, v)
	} else {
		VPXOR(v, v, v)
	}
}

// gatherMask returns an all-ones gather mask: a K register (AVX-512) or
// a vector (AVX2). A gather clears it, so every gather takes a new one.
func (q *q8) gatherMask() Op {
	if q.s.masks {
		r := GP32()
		MOVL(U32(0xffff), r)
		k := K()
		KMOVW(r, k)
		return k
	}
	m := q.s.vec()
	VPCMPEQD(m, m, m)
	return m
}

// gather loads, for each lane, 4 bytes at base+disp+idx*scale into dst
// (its old value, zeroed, is the one kept where the mask is clear: none).
func (q *q8) gather(ps bool, base Register, disp int, idx VecVirtual, scale uint8, dst VecVirtual) {
	q.zero(dst)
	mask := q.gatherMask()
	m := Mem{Base: base, Index: idx, Scale: scale, Disp: disp}
	switch {
	case q.s.masks && ps:
		VGATHERDPS(m, mask, dst)
	case q.s.masks:
		VPGATHERDD(m, mask, dst)
	case ps:
		VGATHERDPS(mask, m, dst)
	default:
		VPGATHERDD(mask, m, dst)
	}
}

// dequant returns the map entries of the lanes' codes at codes, times the
// block's absmax (map first, as dequantizeBlock).
func (q *q8) dequant(codes Mem, table Register, absmax VecVirtual) VecVirtual {
	s := q.s
	idx, e, out := s.vec(), s.vec(), s.vec()
	VPMOVZXBD(codes, idx)
	q.gather(true, table, q8Values, idx, 4, e)
	VMULPS(absmax, e, out)
	return out
}

// update dequantizes, updates and stores one vector at element i, the
// operations of genAdam's body in its order, and folds the new moments'
// magnitudes into accM, accV.
func (q *q8) update(mode int, a q8Args, i Register, amv, avv, accM, accV VecVirtual) {
	f32 := func(base Register, disp int) Mem { return Mem{Base: base, Index: i, Scale: 4, Disp: disp} }
	md := q.dequant(Mem{Base: a.qm, Index: i, Scale: 1}, a.tm, amv)
	vd := q.dequant(Mem{Base: a.qv, Index: i, Scale: 1}, a.tv, avv)
	q.body(mode, f32(a.p, 0), f32(a.g, 0), f32(a.scr, scrM), f32(a.scr, scrV), md, vd, accM, accV)
}

// body runs Adam's body on one vector, the operations of genAdam's body in
// its order, with the master at p, the gradient at g and the moments md,
// vd; it stores the master, the new moments at mOut and vOut, and folds
// their magnitudes into accM, accV.
func (q *q8) body(mode int, p, g, mOut, vOut Mem, md, vd, accM, accV VecVirtual) {
	s := q.s
	vp, vg, vm, vv, t := s.vec(), s.vec(), s.vec(), s.vec(), s.vec()
	VMOVUPS(p, vp)
	VMOVUPS(g, vg)
	switch mode {
	case decayL2:
		VMULPS(q.c(argL2), vp, t) // t = p*l2
		VADDPS(t, vg, vg)         // g = g + t
	case decayAdamW:
		VMULPS(q.c(argDecay), vp, vp) // p = p*decay
	}
	// m = b1*m + c1*g, the c1*g term first.
	VMULPS(q.c(argBeta1), md, vm)
	VMULPS(q.c(argOneMinusBeta1), vg, t)
	VADDPS(vm, t, vm)
	// v = b2*v + (c2*g)*g, the (c2*g)*g term first, g first in its product.
	VMULPS(q.c(argBeta2), vd, vv)
	VMULPS(q.c(argOneMinusBeta2), vg, t)
	VMULPS(t, vg, t)
	VADDPS(vv, t, vv)
	// denom = sqrt(v)/bc2sqrt + eps
	VSQRTPS(vv, t)
	VDIVPS(q.c(argBC2Sqrt), t, t)
	VADDPS(q.c(argEps), t, t)
	// p = p - stepSize*(m/denom)
	VDIVPS(t, vm, vg)
	VMULPS(q.c(argStepSize), vg, vg)
	VSUBPS(vg, vp, vp)
	VMOVUPS(vp, p)
	VMOVUPS(vm, mOut)
	VMOVUPS(vv, vOut)
	// The magnitudes' bits, unsigned maximum.
	q.and(q.c(icAbsMask), vm, vm)
	VPMAXUD(vm, accM, accM)
	q.and(q.c(icAbsMask), vv, vv)
	VPMAXUD(vv, accV, accV)
}

// absmax reduces acc to its largest lane, stores it (the block's absmax)
// at dst and returns the divisor broadcast: the absmax, or 1.0 if 0.
func (q *q8) absmax(acc VecVirtual, dst Mem) VecVirtual {
	s := q.s
	x := acc.AsX()
	if s.masks {
		y := YMM()
		VEXTRACTI64X4(U8(1), acc, y)
		VPMAXUD(y, acc.AsY(), y)
		x = XMM()
		VEXTRACTI32X4(U8(1), y, x)
		VPMAXUD(x, y.AsX(), x)
	} else {
		x = XMM()
		VEXTRACTI128(U8(1), acc, x)
		VPMAXUD(x, acc.AsX(), x)
	}
	t := XMM()
	VPSHUFD(U8(0x4e), x, t)
	VPMAXUD(t, x, x)
	VPSHUFD(U8(0xb1), x, t)
	VPMAXUD(t, x, x)
	r := GP32()
	VMOVD(x, r)
	MOVL(r, dst)
	one := GP32()
	MOVL(U32(0x3f80_0000), one)
	TESTL(r, r)
	CMOVLEQ(one, r)
	d := s.vec()
	VMOVD(r, d.AsX())
	VPBROADCASTD(d.AsX(), d)
	return d
}

// quantize codes the lanes at src (divided by div) with table and stores
// the codes as bytes at dst: packedCode, lane by lane.
func (q *q8) quantize(src Mem, div Op, table Register, dst Mem) {
	s := q.s
	x, y := s.vec(), s.vec()
	VMOVUPS(src, x)
	VDIVPS(div, x, y) // y = x/div
	// k = clamp((bits(|y|)>>16) - bucketLo, 0, top), + the negative half's
	// offset when the sign bit is set.
	a, k, sg := s.vec(), s.vec(), s.vec()
	q.and(q.c(icAbsMask), y, a)
	VPSRLD(U8(16), a, k)
	VPSUBD(q.c(icBucketLo), k, k)
	VPMAXSD(q.c(icZero), k, k)
	VPMINSD(q.c(icBucketTop), k, k)
	VPSRAD(U8(31), y, sg)
	t := s.vec()
	q.and(q.c(icBucketNeg), sg, t)
	VPADDD(t, k, k)
	// The bucket's entry: its code (bits 24-31) and threshold key.
	e := s.vec()
	q.gather(false, table, q8Packed, k, 4, e)
	// key = low 16 bits of |y|, complemented when negative.
	q.and(q.c(icLow16), a, a)
	q.and(q.c(icLow16), sg, sg)
	q.xor(sg, a, a)
	q.and(q.c(icKeyMask), e, t) // the threshold key
	VPSRLD(U8(24), e, e)        // the code
	if s.masks {
		ge := K()
		VPCMPUD(U8(5), t, a, ge) // key >= threshold key (not less than)
		VPADDD(q.c(icOne), e, ge, e)
		VPMOVDB(e, dst)
		return
	}
	VPADDD(q.c(icOne), a, a) // key+1 > threshold key: key >= it
	VPCMPGTD(t, a, a)        // all ones where so
	VPSUBD(a, e, e)          // code - (-1)
	VPSHUFB(q.c(icShuffle), e, e)
	perm := s.vec()
	VMOVDQU(q.c(icPerm), perm)
	VPERMD(e, perm, e)
	VMOVQ(e.AsX(), dst)
}

// xor is the integer XOR of vectors (VPXORD on ZMM, VPXOR on YMM).
func (q *q8) xor(a, b, dst Op) {
	if q.s.masks {
		VPXORD(a, b, dst)
	} else {
		VPXOR(a, b, dst)
	}
}

// avx2Blocks emits the AVX2 kernel's blocks. Its map entries are read by
// scalar loads into the scratch (a separate loop per block, before the
// block's update: mixed into the update or the coding loop, their
// instructions slowed those loops by as much as they cost alone), and its
// codes are found in the wide table, whose index is one shift of y's bits,
// with every constant of the coding loop in a register (as memory
// operands, their loads competed with the gathers' for the load ports).
// Per block:
//
//  1. for each vector: exp_avg and exp_avg_sq from the scratch's map
//     entries times the block's absmax; Adam's body; the master stored,
//     the new moments into the scratch, their magnitudes' maximum;
//  2. the new absmax stored; the divisors;
//  3. for each vector: both moments coded from the scratch (wideCode:
//     one gather of the wide entries) and stored;
//  4. the map entries of the next block's codes into the scratch (block
//     0's are read before the loop).
func (q *q8) avx2Blocks(name string, mode, blocks, tm, tv Register, scr Register) {
	TESTQ(blocks, blocks)
	JEQ(LabelRef(name + "_return"))
	Comment("The map entries of block 0's codes into the scratch.")
	{
		qm := Load(Param("qm"), GP64())
		qv := Load(Param("qv"), GP64())
		q.entriesLoop(name+"_first", qm, qv, tm, tv, scr)
	}
	CMPQ(mode, U8(decayL2))
	JEQ(LabelRef(name + "_l2"))
	CMPQ(mode, U8(decayAdamW))
	JEQ(LabelRef(name + "_adamw"))
	q.avx2Loop(name+"_plain", decayNone, tm, tv, scr)
	Label(name + "_l2")
	q.avx2Loop(name+"_l2", decayL2, tm, tv, scr)
	Label(name + "_adamw")
	q.avx2Loop(name+"_adamw", decayAdamW, tm, tv, scr)
	Label(name + "_return")
	VZEROUPPER()
	RET()
}

// avx2Loop emits avx2Blocks' loop over blocks for one weight-decay mode,
// and the return. The block's pointers are computed from the arguments
// and the block index b, so that few registers stay live across phases.
func (q *q8) avx2Loop(label string, mode int, tm, tv, scr Register) {
	s := q.s
	b := GP64()
	XORQ(b, b)
	Label(label + "_block")
	blocks := Load(Param("blocks"), GP64())
	CMPQ(b, blocks)
	JEQ(LabelRef(label + "_done"))

	Comment("Phase 1: update from the scratch's map entries, keep the new moments and their absmax.")
	{
		off := GP64()
		MOVQ(b, off)
		SHLQ(U8(10), off) // 4*q8Block bytes a block
		p := Load(Param("p"), GP64())
		ADDQ(off, p)
		g := Load(Param("grad"), GP64())
		ADDQ(off, g)
		am := Load(Param("am"), GP64())
		av := Load(Param("av"), GP64())
		amv, avv := s.vec(), s.vec()
		VBROADCASTSS(Mem{Base: am, Index: b, Scale: 4}, amv)
		VBROADCASTSS(Mem{Base: av, Index: b, Scale: 4}, avv)
		accM, accV := s.vec(), s.vec()
		q.zero(accM)
		q.zero(accV)
		i := GP64()
		XORQ(i, i)
		Label(label + "_update")
		at := func(base Register, disp int) Mem { return Mem{Base: base, Index: i, Scale: 4, Disp: disp} }
		md, vd := s.vec(), s.vec()
		VMULPS(at(scr, scrNextM), amv, md) // map entry times absmax, as dequantizeBlock
		VMULPS(at(scr, scrNextV), avv, vd)
		q.body(mode, at(p, 0), at(g, 0), at(scr, scrM), at(scr, scrV), md, vd, accM, accV)
		ADDQ(U8(s.lanes), i)
		CMPQ(i, U32(q8Block))
		JL(LabelRef(label + "_update"))

		Comment("Phase 2: the new absmax, stored; the divisors (1.0 for an absmax of 0), kept in the scratch.")
		divM := q.absmax(accM, Mem{Base: am, Index: b, Scale: 4})
		VMOVUPS(divM, Mem{Base: scr, Disp: q.cbase + 32*icDivM})
		divV := q.absmax(accV, Mem{Base: av, Index: b, Scale: 4})
		VMOVUPS(divV, Mem{Base: scr, Disp: q.cbase + 32*icDivV})
	}

	Comment("Phase 3: requantize the block from the scratch.")
	{
		qm := Load(Param("qm"), GP64())
		qv := Load(Param("qv"), GP64())
		off := GP64()
		MOVQ(b, off)
		SHLQ(U8(8), off) // q8Block codes a block
		ADDQ(off, qm)
		ADDQ(off, qv)
		// The loop's constants, in registers: the loads of memory operands
		// compete with the gathers' for the load ports.
		kb, shuf, perm, dm, dv := s.vec(), s.vec(), s.vec(), s.vec(), s.vec()
		VMOVDQU(q.c(icKeyBits), kb)
		VMOVDQU(q.c(icShuffle), shuf)
		VMOVDQU(q.c(icPerm), perm)
		VMOVUPS(q.c(icDivM), dm)
		VMOVUPS(q.c(icDivV), dv)
		i := GP64()
		XORQ(i, i)
		Label(label + "_quant")
		q.quantizeWide(Mem{Base: scr, Index: i, Scale: 4, Disp: scrM}, dm, tm, Mem{Base: qm, Index: i, Scale: 1}, kb, shuf, perm)
		q.quantizeWide(Mem{Base: scr, Index: i, Scale: 4, Disp: scrV}, dv, tv, Mem{Base: qv, Index: i, Scale: 1}, kb, shuf, perm)
		ADDQ(U8(s.lanes), i)
		CMPQ(i, U32(q8Block))
		JL(LabelRef(label + "_quant"))
	}
	Comment("Phase 4: the next block's map entries into the scratch (none after the last block).")
	{
		blocks := Load(Param("blocks"), GP64())
		INCQ(b)
		CMPQ(b, blocks)
		JEQ(LabelRef(label + "_done"))
		off := GP64()
		MOVQ(b, off)
		SHLQ(U8(8), off) // q8Block codes a block
		nm := Load(Param("qm"), GP64())
		ADDQ(off, nm)
		nv := Load(Param("qv"), GP64())
		ADDQ(off, nv)
		q.entriesLoop(label+"_entries", nm, nv, tm, tv, scr)
	}
	JMP(LabelRef(label + "_block"))
	Label(label + "_done")
	VZEROUPPER()
	RET()
}

// quantizeWide codes the 8 lanes at src (divided by div) with table's wide
// entries and stores the codes as bytes at dst: wideCode, lane by lane.
// kb holds 0xffff00, shuf and perm the byte gathering of quantize.
func (q *q8) quantizeWide(src Mem, div VecVirtual, table Register, dst Mem, kb, shuf, perm VecVirtual) {
	s := q.s
	y := s.vec()
	VMOVUPS(src, y)
	VDIVPS(div, y, y) // y = x/div
	// The entry of y's top 16 bits.
	k, e := s.vec(), s.vec()
	VPSRLD(U8(16), y, k)
	q.gather(false, table, q8Wide, k, 4, e)
	// K = key(y)*256: y's bits complemented when negative, shifted, masked.
	sg := s.vec()
	VPSRAD(U8(31), y, sg)
	VPXOR(sg, y, y)
	VPSLLD(U8(8), y, y)
	VPAND(kb, y, y)
	VPCMPGTD(e, y, y) // all ones where K > e: key(y) >= the threshold's key
	VPSUBD(y, e, e)   // the code in the low byte, one more where so
	VPSHUFB(shuf, e, e)
	VPERMD(e, perm, e)
	VMOVQ(e.AsX(), dst)
}

// entries loads the map entries of the 8 codes at codes from table and
// stores them at dst, dst+4, ...: one 8-byte load of the codes, then per
// code a byte extracted and a scalar load, two entries joined into each
// 8-byte store.
func (q *q8) entries(codes Mem, table Register, dst Mem) {
	c := GP64()
	MOVQ(codes, c)
	for k := 0; k < 8; k += 2 {
		x0, x1 := GP64(), GP64()
		MOVBQZX(c.As8(), x0)
		SHRQ(U8(8), c)
		MOVBQZX(c.As8(), x1)
		if k < 6 {
			SHRQ(U8(8), c)
		}
		e0, e1 := GP64(), GP64()
		MOVL(Mem{Base: table, Index: x0, Scale: 4, Disp: q8Values}, e0.As32())
		MOVL(Mem{Base: table, Index: x1, Scale: 4, Disp: q8Values}, e1.As32())
		SHLQ(U8(32), e1)
		ORQ(e0, e1)
		d := dst
		d.Disp += 4 * k
		MOVQ(e1, d)
	}
}

// entriesLoop emits the loop that puts the map entries of a block's codes
// (exp_avg's at qm, exp_avg_sq's at qv) into the scratch, where the next
// update loop reads them: block 0's before the loop over blocks, each next
// block's at the end of one.
func (q *q8) entriesLoop(label string, qm, qv, tm, tv, scr Register) {
	i := GP64()
	XORQ(i, i)
	Label(label)
	q.entries(Mem{Base: qm, Index: i, Scale: 1}, tm, Mem{Base: scr, Index: i, Scale: 4, Disp: scrNextM})
	q.entries(Mem{Base: qv, Index: i, Scale: 1}, tv, Mem{Base: scr, Index: i, Scale: 4, Disp: scrNextV})
	ADDQ(U8(q.s.lanes), i)
	CMPQ(i, U32(q8Block))
	JL(LabelRef(label))
}

package main

import (
	"fmt"

	. "github.com/mmcloughlin/avo/build"
	. "github.com/mmcloughlin/avo/operand"
	. "github.com/mmcloughlin/avo/reg"
)

// SGD: mode bits (sgdWeightDecay ... sgdNesterov in ../../sgd.go) and
// constants (sgdArgLR ... in the same file).
const (
	sgdWeightDecay = 1 << iota
	sgdMomentum
	sgdLater
	sgdNesterov
)

const (
	sgdArgLR = iota
	sgdArgWeightDecay
	sgdArgMomentum
	sgdArgOneMinusDampening
	sgdArgCount
)

// Adagrad: mode bit and constants (../../adagrad.go).
const adagradWeightDecay = 1

const (
	adagradArgNegCLR = iota
	adagradArgWeightDecay
	adagradArgEps
	adagradArgCount
)

// Lion: mode bit and constants (../../lion.go).
const lionDecay = 1

const (
	lionArgBeta1 = iota
	lionArgOneMinusBeta1
	lionArgBeta2
	lionArgOneMinusBeta2
	lionArgLR
	lionArgDecay
	lionArgOne
	lionArgSignBit
	lionArgCount
)

// ruleUnroll is the vectors per loop iteration of the SGD, Adagrad and
// Lion kernels: they are bound by memory, two is enough to keep the loop
// overhead off the critical path.
const ruleUnroll = 2

// Comparison predicates of VCMPPS (quiet: a QNaN operand raises nothing).
const (
	cmpUnordQ = 0x03 // either operand NaN
	cmpNeqOQ  = 0x0c // ordered and not equal: false for NaN and for ±0 against ±0
)

// ruleFunc declares name(w, grad, <state> *float32, n int, args
// [count]float32, mode int) and loads its arguments: the pointers, n as a
// byte length, mode, and a zeroed byte offset i. The constants come by
// value (broadcast from the argument frame), so a caller's args never
// escape to the heap through the kernel's function value.
func ruleFunc(s isa, name, state, what string, count int) (w, g, x, n, mode, i Register) {
	TEXT(name, NOSPLIT, fmt.Sprintf("func(w, grad, %s *float32, n int, args [%d]float32, mode int)", state, count))
	Pragma("noescape")
	Doc(fmt.Sprintf("%s runs %s on elements [0, n) of w, grad, %s, %d lanes at a time; n must be a positive multiple of %d.", name, what, state, s.lanes, s.lanes))
	w = Load(Param("w"), GP64())
	g = Load(Param("grad"), GP64())
	x = Load(Param(state), GP64())
	n = Load(Param("n"), GP64())
	mode = Load(Param("mode"), GP64())
	Comment("n becomes the byte length; i is the byte offset of the next vector.")
	SHLQ(U8(2), n)
	i = GP64()
	XORQ(i, i)
	return
}

// dispatch jumps to name_mode<m> for each mode but the first, which
// follows; then it emits each mode's section: its label, the constants it
// broadcasts, its loops.
func dispatch(s isa, name string, mode, n, i Register, modes []int, need func(m int) []int, vec func(m int, k []VecVirtual, disp int)) {
	label := func(m int) string { return fmt.Sprintf("%s_mode%d", name, m) }
	for _, m := range modes[1:] {
		CMPQ(mode, U8(m))
		JEQ(LabelRef(label(m)))
	}
	for j, m := range modes {
		if j > 0 {
			Label(label(m))
		}
		Comment(fmt.Sprintf("Mode %#x: broadcast its constants.", m))
		k := make([]VecVirtual, 16)
		for _, c := range need(m) {
			k[c] = broadcast(s, c)
		}
		emitLoops(s, ruleUnroll, label(m), n, i, func(disp int) { vec(m, k, disp) })
	}
}

// sgdModes are the SGD kernels' valid modes: with or without weight
// decay, times no momentum, the first momentum step, a later one, and
// Nesterov's variants of both.
func sgdModes() []int {
	var modes []int
	for _, wd := range []int{0, sgdWeightDecay} {
		for _, mom := range []int{0, sgdMomentum, sgdMomentum | sgdLater, sgdMomentum | sgdNesterov, sgdMomentum | sgdLater | sgdNesterov} {
			modes = append(modes, wd|mom)
		}
	}
	return modes
}

// sgdNeeds are the constants SGD's mode m reads.
func sgdNeeds(m int) []int {
	c := []int{sgdArgLR}
	if m&sgdWeightDecay != 0 {
		c = append(c, sgdArgWeightDecay)
	}
	if m&sgdLater != 0 || m&sgdNesterov != 0 {
		c = append(c, sgdArgMomentum)
	}
	if m&sgdLater != 0 {
		c = append(c, sgdArgOneMinusDampening)
	}
	return c
}

// genSGD emits sgd<ISA>: torch.optim.SGD (sgdScalar) for every valid mode.
func genSGD(s isa) {
	name := "sgd" + s.name
	w, g, buf, n, mode, i := ruleFunc(s, name, "buf", "SGD", sgdArgCount)
	modes, need := sgdModes(), sgdNeeds
	dispatch(s, name, mode, n, i, modes, need, func(m int, k []VecVirtual, disp int) {
		at := func(base Register) Mem { return Mem{Base: base, Index: i, Scale: 1, Disp: disp} }
		vw, vd, t := s.vec(), s.vec(), s.vec()
		VMOVUPS(at(w), vw)
		VMOVUPS(at(g), vd)
		if m&sgdWeightDecay != 0 {
			// d = d + wd*w, d first (as the compiled scalar loop).
			VMULPS(vw, k[sgdArgWeightDecay], t)
			VADDPS(t, vd, vd)
		}
		if m&sgdMomentum != 0 {
			b := vd // step 1: buf = d
			if m&sgdLater != 0 {
				// buf = mom*buf + damp*d, the mom*buf term first.
				b = s.vec()
				VMULPS(at(buf), k[sgdArgMomentum], b)
				VMULPS(k[sgdArgOneMinusDampening], vd, t)
				VADDPS(t, b, b)
			}
			VMOVUPS(b, at(buf))
			if m&sgdNesterov != 0 {
				// d = d + mom*buf, the mom*buf term first.
				VMULPS(k[sgdArgMomentum], b, t)
				VADDPS(vd, t, vd)
			} else {
				vd = b
			}
		}
		// w = w - lr*d
		VMULPS(k[sgdArgLR], vd, t)
		VSUBPS(t, vw, vw)
		VMOVUPS(vw, at(w))
	})
}

// genAdagrad emits adagrad<ISA>: torch.optim.Adagrad (adagradScalar).
func genAdagrad(s isa) {
	name := "adagrad" + s.name
	w, g, sum, n, mode, i := ruleFunc(s, name, "s", "Adagrad", adagradArgCount)
	need := func(m int) []int {
		c := []int{adagradArgNegCLR, adagradArgEps}
		if m&adagradWeightDecay != 0 {
			c = append(c, adagradArgWeightDecay)
		}
		return c
	}
	dispatch(s, name, mode, n, i, []int{0, adagradWeightDecay}, need, func(m int, k []VecVirtual, disp int) {
		at := func(base Register) Mem { return Mem{Base: base, Index: i, Scale: 1, Disp: disp} }
		vw, vd, t, vs := s.vec(), s.vec(), s.vec(), s.vec()
		VMOVUPS(at(w), vw)
		VMOVUPS(at(g), vd)
		if m&adagradWeightDecay != 0 {
			// d = d + wd*w, d first.
			VMULPS(vw, k[adagradArgWeightDecay], t)
			VADDPS(t, vd, vd)
		}
		// s = s + d*d, the d*d term first.
		VMULPS(vd, vd, t)
		VADDPS(at(sum), t, vs)
		// std = sqrt(s) + eps
		std := s.vec()
		VSQRTPS(vs, std)
		VADDPS(k[adagradArgEps], std, std)
		// w = w + (nclr*d)/std, the quotient first.
		VMULPS(k[adagradArgNegCLR], vd, t)
		VDIVPS(std, t, t)
		VADDPS(vw, t, t)
		VMOVUPS(t, at(w))
		VMOVUPS(vs, at(sum))
	})
}

// genLion emits lion<ISA>: Lion (lionScalar).
func genLion(s isa) {
	name := "lion" + s.name
	w, g, mom, n, mode, i := ruleFunc(s, name, "m", "Lion", lionArgCount)
	need := func(m int) []int {
		c := []int{lionArgBeta1, lionArgOneMinusBeta1, lionArgBeta2, lionArgOneMinusBeta2, lionArgLR, lionArgOne, lionArgSignBit}
		if m&lionDecay != 0 {
			c = append(c, lionArgDecay)
		}
		return c
	}
	dispatch(s, name, mode, n, i, []int{0, lionDecay}, need, func(m int, k []VecVirtual, disp int) {
		at := func(base Register) Mem { return Mem{Base: base, Index: i, Scale: 1, Disp: disp} }
		vg, vm, c, t := s.vec(), s.vec(), s.vec(), s.vec()
		VMOVUPS(at(g), vg)
		VMOVUPS(at(mom), vm)
		// c = b1*m + c1*g, the c1*g term first.
		VMULPS(vm, k[lionArgBeta1], c)
		VMULPS(k[lionArgOneMinusBeta1], vg, t)
		VADDPS(c, t, c)
		vw := s.vec()
		VMOVUPS(at(w), vw)
		if m&lionDecay != 0 {
			VMULPS(k[lionArgDecay], vw, vw)
		}
		// w = w - lr*sign(c)
		u := sign(s, c, k[lionArgOne], k[lionArgSignBit])
		VMULPS(k[lionArgLR], u, u)
		VSUBPS(u, vw, vw)
		VMOVUPS(vw, at(w))
		// m = b2*m + c2*g, the c2*g term first.
		VMULPS(vm, k[lionArgBeta2], vm)
		VMULPS(k[lionArgOneMinusBeta2], vg, t)
		VADDPS(vm, t, vm)
		VMOVUPS(vm, at(mom))
	})
}

// sign returns the scalar loop's sign of each lane of c: +1 above zero, -1
// below, +0 for either zero, c itself (payload and sign untouched) for a
// NaN. one holds 1.0 in every lane, signBit -0.0 (only the sign bit set),
// which also serves as the zero to compare against (-0 equals +0).
func sign(s isa, c, one, signBit VecVirtual) VecVirtual {
	t, u := s.vec(), s.vec()
	if s.masks {
		nz, nan := K(), K()
		VCMPPS(U8(cmpNeqOQ), signBit, c, nz) // c != 0 and not NaN
		VCMPPS(U8(cmpUnordQ), c, c, nan)     // c is NaN
		VPANDD(signBit, c, t)                // c's sign bit
		VPORD_Z(one, t, nz, t)               // ±1 where nz, else +0
		VBLENDMPS(c, t, nan, u)              // c where NaN
		return u
	}
	nz, nan := s.vec(), s.vec()
	VCMPPS(U8(cmpNeqOQ), signBit, c, nz) // all ones where c != 0 and not NaN
	VANDPS(signBit, c, t)                // c's sign bit
	VORPS(one, t, t)                     // ±1
	VANDPS(nz, t, t)                     // ±1 where nz, else +0
	VCMPPS(U8(cmpUnordQ), c, c, nan)     // all ones where c is NaN
	VANDPS(c, nan, nan)                  // c where NaN, else +0
	VORPS(nan, t, u)
	return u
}

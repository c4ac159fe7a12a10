package main

// The arm64 kernels: NEON (Advanced SIMD) versions of the four update
// rules, written as Go arm64 assembly text. avo emits amd64 only, and the
// kernels are small and regular, so a few helpers here print them.
//
// Go's arm64 assembler has no mnemonics for the vector floating-point
// instructions (FADD, FSUB, FMUL, FDIV, FSQRT and the comparisons on
// Vn.4S), so those are emitted as WORD $0x... encodings with the
// instruction, in Arm's syntax, in a comment; neonEnc builds them from
// the operation and its registers, and neon_test.go decodes every word the
// generator emits (mutants included) with golang.org/x/arch's arm64
// disassembler and checks it is the instruction the comment names. Loads,
// stores, broadcasts and bitwise operations use the assembler's own
// mnemonics (VLD1, VST1, VDUP, VAND, VORR, VBIF).
//
// Operand order. Arm's rule for a NaN operand (FPCR.DN = 0, as Go runs
// and Linux starts every process) is not x86's: an operation returns its
// first signalling NaN operand, quieted, and only when neither is
// signalling its first quiet NaN, "first" meaning Rn before Rm. Vector and
// scalar instructions follow the same rule, so each kernel here puts in Rn
// the operand that the compiled scalar loop (adamScalar, sgdScalar,
// adagradScalar, lionScalar in ../..) puts in Rn, read off its arm64
// disassembly (GOARCH=arm64 go test -c; go tool objdump) with Go 1.26.
// Go's syntax "FADDS F1, F2, F3" is Arm's "FADD S3, S2, S1": Rn is the
// middle operand. The order differs from the amd64 kernels' in places
// (SGD's and Adam's weight-decay additions put the product first here),
// because the compiler chose differently for each architecture. The
// differential tests, run on arm64 (make test-arm64, under qemu-aarch64 on
// other machines), fail if a compiler release reorders them.
//
// Every kernel takes n, a positive multiple of 4, and updates two vectors
// (8 elements) per iteration while a block is left, then the last vector.
// The registers: R0-R3 the arrays' next vectors (advanced by post-indexed
// loads or stores), R4 the elements left, R5 the mode; V0-V7 the arrays'
// values (two consecutive registers each, one per vector of a block),
// V8-V15 temporaries (two each), V16 up the broadcast constants.

import (
	"bytes"
	"fmt"
	"strings"
)

const neonLanes = 4

// Instruction encodings on four single-precision lanes (Q=1, size 0)
// that the Go assembler has no mnemonic for. The registers go into Rd
// (bits 0-4), Rn (5-9) and Rm (16-20).
const (
	encFADD   = 0x4e20d400 // FADD Vd.4S, Vn.4S, Vm.4S
	encFSUB   = 0x4ea0d400 // FSUB Vd.4S, Vn.4S, Vm.4S
	encFMUL   = 0x6e20dc00 // FMUL Vd.4S, Vn.4S, Vm.4S
	encFDIV   = 0x6e20fc00 // FDIV Vd.4S, Vn.4S, Vm.4S
	encFSQRT  = 0x6ea1f800 // FSQRT Vd.4S, Vn.4S
	encFCMEQ  = 0x4e20e400 // FCMEQ Vd.4S, Vn.4S, Vm.4S: all ones where equal (false for NaN)
	encFCMEQZ = 0x4ea0d800 // FCMEQ Vd.4S, Vn.4S, #0.0
	encBIC    = 0x4e601c00 // BIC Vd.16B, Vn.16B, Vm.16B: Vn AND NOT Vm
	encFMLA   = 0x4e20cc00 // FMLA Vd.4S, Vn.4S, Vm.4S: Vd + Vn*Vm fused (mutants only)
	encFMOV1  = 0x4f03f600 // FMOV Vd.4S, #1.0 (mutants only)
)

// neonOp is one of the instructions above: its encoding, its Arm name and
// whether it has an Rm register (else Rn only, or no source for FMOV).
type neonOp struct {
	enc    uint32
	name   string
	srcs   int    // register sources: 0, 1 or 2
	suffix string // printed after the sources (an immediate)
	arr    string // arrangement: "4S" or "16B"
}

var (
	opFADD   = neonOp{encFADD, "FADD", 2, "", "4S"}
	opFSUB   = neonOp{encFSUB, "FSUB", 2, "", "4S"}
	opFMUL   = neonOp{encFMUL, "FMUL", 2, "", "4S"}
	opFDIV   = neonOp{encFDIV, "FDIV", 2, "", "4S"}
	opFSQRT  = neonOp{encFSQRT, "FSQRT", 1, "", "4S"}
	opFCMEQ  = neonOp{encFCMEQ, "FCMEQ", 2, "", "4S"}
	opFCMEQZ = neonOp{encFCMEQZ, "FCMEQ", 1, ", #0.0", "4S"}
	opBIC    = neonOp{encBIC, "BIC", 2, "", "16B"}
	opFMLA   = neonOp{encFMLA, "FMLA", 2, "", "4S"}
	opFMOV1  = neonOp{encFMOV1, "FMOV", 0, ", #1.0", "4S"}
)

// neonEnc returns the encoding of op with destination d and sources n and
// m (ignored where op has fewer), and its text in Arm's syntax.
func neonEnc(op neonOp, d, n, m int) (uint32, string) {
	for _, r := range []int{d, n, m} {
		if r < 0 || r > 31 {
			panic(fmt.Sprintf("asmgen: vector register V%d", r))
		}
	}
	enc := op.enc | uint32(d)
	text := fmt.Sprintf("%s V%d.%s", op.name, d, op.arr)
	if op.srcs >= 1 {
		enc |= uint32(n) << 5
		text += fmt.Sprintf(", V%d.%s", n, op.arr)
	}
	if op.srcs == 2 {
		enc |= uint32(m) << 16
		text += fmt.Sprintf(", V%d.%s", m, op.arr)
	}
	return enc, text + op.suffix
}

// val is a vector value of a kernel body: two consecutive registers from
// base (one per vector of a two-vector block), or one register shared by
// both (a broadcast constant).
type val struct {
	base   int
	shared bool
}

func (v val) at(j int) int {
	if v.shared {
		return v.base
	}
	return v.base + j
}

// The registers of a body's values.
var (
	vA0, vA1, vA2, vA3 = val{base: 0}, val{base: 2}, val{base: 4}, val{base: 6}
	vT0, vT1, vT2, vT3 = val{base: 8}, val{base: 10}, val{base: 12}, val{base: 14}
)

// neonGen accumulates the assembly and Go declarations of the kernels.
type neonGen struct {
	asm, stubs bytes.Buffer
	mutation   string // a deviation to build in (neonMutations), or ""
	used       map[string]bool
	u          int // vectors the body being emitted updates (1 or 2)
}

func (g *neonGen) line(format string, a ...any) {
	fmt.Fprintf(&g.asm, format+"\n", a...)
}

// ins emits an instruction the Go assembler knows.
func (g *neonGen) ins(op, args string) {
	if args == "" {
		g.line("\t%s", op)
		return
	}
	g.line("\t%-7s %s", op, args)
}

// vop emits op on every vector of the current body: d = n op m.
func (g *neonGen) vop(op neonOp, d, n, m val) {
	for j := range g.u {
		enc, text := neonEnc(op, d.at(j), n.at(j), m.at(j))
		g.line("\tWORD    $0x%08x // %s", enc, text)
	}
}

// mutated reports whether the kernel being generated carries mutation
// name (and records that the generator knows it).
func (g *neonGen) mutated(name string) bool {
	g.used[name] = true
	return g.mutation == name
}

// list is the register list of value v for VLD1/VST1.
func (g *neonGen) list(v val) string {
	var r []string
	for j := range g.u {
		r = append(r, fmt.Sprintf("V%d.S4", v.at(j)))
	}
	return "[" + strings.Join(r, ", ") + "]"
}

// load loads v from the array at register ptr, advancing ptr when post.
func (g *neonGen) load(v val, ptr string, post bool) {
	if post {
		g.ins("VLD1.P", fmt.Sprintf("%d(%s), %s", 16*g.u, ptr, g.list(v)))
	} else {
		g.ins("VLD1", fmt.Sprintf("(%s), %s", ptr, g.list(v)))
	}
}

// store stores v to the array at register ptr and advances ptr.
func (g *neonGen) store(v val, ptr string) {
	g.ins("VST1.P", fmt.Sprintf("%s, %d(%s)", g.list(v), 16*g.u, ptr))
}

// bitop emits a bitwise operation the Go assembler knows (VAND, VORR,
// VBIF) on every vector; Go's operand order: Vm, Vn, Vd.
func (g *neonGen) bitop(op string, m, n, d val) {
	for j := range g.u {
		g.ins(op, fmt.Sprintf("V%d.B16, V%d.B16, V%d.B16", m.at(j), n.at(j), d.at(j)))
	}
}

// kernelSpec declares one kernel: its name and Go signature, the frame
// offsets of its arguments, and the pointer registers R0.. in order.
type kernelSpec struct {
	name, rule string
	ptrs       []string // pointer parameters after which come n, args, mode
	args       int      // float32 constants in args
}

func (s kernelSpec) argsOff() int { return 8 * (len(s.ptrs) + 1) }
func (s kernelSpec) modeOff() int { return (s.argsOff() + 4*s.args + 7) &^ 7 }
func (s kernelSpec) frame() int   { return s.modeOff() + 8 }

// begin emits the declaration and prologue of a kernel: its stub, its
// TEXT line, the pointers in R0.., n in R4, mode in R5.
func (g *neonGen) begin(s kernelSpec) {
	fmt.Fprintf(&g.stubs, "\n// %s runs %s on elements [0, n) of %s, %d lanes at a time; n must be a positive multiple of %d.\n//\n//go:noescape\n",
		s.name, s.rule, strings.Join(s.ptrs, ", "), neonLanes, neonLanes)
	fmt.Fprintf(&g.stubs, "func %s(%s *float32, n int, args [%d]float32, mode int)\n", s.name, strings.Join(s.ptrs, ", "), s.args)

	g.line("")
	g.line("// func %s(%s *float32, n int, args [%d]float32, mode int)", s.name, strings.Join(s.ptrs, ", "), s.args)
	g.line("TEXT ·%s(SB), NOSPLIT, $0-%d", s.name, s.frame())
	for i, p := range s.ptrs {
		g.ins("MOVD", fmt.Sprintf("%s+%d(FP), R%d", p, 8*i, i))
	}
	g.ins("MOVD", fmt.Sprintf("n+%d(FP), R4", 8*len(s.ptrs)))
	g.ins("MOVD", fmt.Sprintf("mode+%d(FP), R5", s.modeOff()))
}

// section emits the dispatch to each mode's loop (the first mode's
// follows the dispatch) and each mode's section: the constants it needs
// broadcast into V16 up, then its loops. body emits the update of g.u
// vectors for mode m with the constants k (indexed like args).
func (g *neonGen) sections(s kernelSpec, modes []int, need func(m int) []int, body func(m int, k []val)) {
	label := func(m int) string { return fmt.Sprintf("%s_mode%d", s.name, m) }
	for _, m := range modes[1:] {
		g.ins("CMP", fmt.Sprintf("$%d, R5", m))
		g.ins("BEQ", label(m))
	}
	for i, m := range modes {
		if i > 0 {
			g.line("")
			g.line("%s:", label(m))
		}
		g.line("\t// Mode %#x: broadcast its constants.", m)
		k := make([]val, s.args)
		next := 16
		for _, c := range need(m) {
			g.ins("FMOVS", fmt.Sprintf("args_%d+%d(FP), F%d", c, s.argsOff()+4*c, next))
			g.ins("VDUP", fmt.Sprintf("V%d.S[0], V%d.S4", next, next))
			k[c] = val{base: next, shared: true}
			next++
		}
		l := label(m)
		g.line("")
		g.line("%s_block:", l)
		g.line("\t// Two vectors per iteration while a whole block is left.")
		g.ins("CMP", fmt.Sprintf("$%d, R4", 2*neonLanes))
		g.ins("BLT", l+"_single")
		g.u = 2
		body(m, k)
		g.ins("SUB", fmt.Sprintf("$%d, R4", 2*neonLanes))
		g.ins("B", l+"_block")
		g.line("")
		g.line("%s_single:", l)
		g.line("\t// The last vector, if n is an odd number of vectors.")
		g.ins("CBZ", "R4, "+l+"_done")
		if !g.mutated("any/skips-last-vector") {
			g.u = 1
			body(m, k)
		}
		g.line("")
		g.line("%s_done:", l)
		g.ins("RET", "")
	}
}

// The constants' indexes (args order) and mode values are the ones
// main.go and rules.go declare for the amd64 kernels.

// genAdamNEON emits adamNEON: adamScalar's operations, each with the
// scalar loop's Rn and Rm.
func (g *neonGen) genAdamNEON() {
	s := kernelSpec{name: "adamNEON", rule: "Adam", ptrs: []string{"p", "grad", "m", "v"}, args: argCount}
	g.begin(s)
	need := func(m int) []int {
		c := []int{argBeta1, argOneMinusBeta1, argBeta2, argOneMinusBeta2, argBC2Sqrt, argEps, argStepSize}
		switch m {
		case decayL2:
			c = append(c, argL2)
		case decayAdamW:
			c = append(c, argDecay)
		}
		return c
	}
	g.sections(s, []int{decayNone, decayL2, decayAdamW}, need, func(mode int, k []val) {
		p, gr, m, v, t := vA0, vA1, vA2, vA3, vT0
		g.load(p, "R0", false)
		g.load(gr, "R1", true)
		g.load(m, "R2", false)
		g.load(v, "R3", false)
		switch mode {
		case decayL2:
			g.line("\t// g = l2*p + g")
			g.vop(opFMUL, t, k[argL2], p)
			g.vop(opFADD, gr, t, gr)
		case decayAdamW:
			g.line("\t// p = decay*p")
			g.vop(opFMUL, p, k[argDecay], p)
		}
		g.line("\t// m = (g*c1) + (b1*m)")
		g.vop(opFMUL, m, k[argBeta1], m)
		if g.mutated("adam/exp_avg-fma") {
			g.vop(opFMLA, m, gr, k[argOneMinusBeta1])
		} else {
			g.vop(opFMUL, t, gr, k[argOneMinusBeta1])
			if g.mutated("adam/exp_avg-add-order") {
				g.vop(opFADD, m, m, t)
			} else {
				g.vop(opFADD, m, t, m)
			}
		}
		g.line("\t// v = (g*(g*c2)) + (b2*v)")
		g.vop(opFMUL, v, k[argBeta2], v)
		g.vop(opFMUL, t, gr, k[argOneMinusBeta2])
		g.vop(opFMUL, t, gr, t)
		g.vop(opFADD, v, t, v)
		g.line("\t// denom = sqrt(v)/bc2sqrt + eps")
		g.vop(opFSQRT, t, v, v)
		g.vop(opFDIV, t, t, k[argBC2Sqrt])
		g.vop(opFADD, t, t, k[argEps])
		g.line("\t// p = p - stepSize*(m/denom)")
		if g.mutated("adam/divide-by-reciprocal") {
			g.vop(opFMOV1, gr, gr, gr)
			g.vop(opFDIV, t, gr, t)
			g.vop(opFMUL, gr, m, t)
		} else {
			g.vop(opFDIV, gr, m, t)
		}
		g.vop(opFMUL, gr, k[argStepSize], gr)
		g.vop(opFSUB, p, p, gr)
		g.store(p, "R0")
		g.store(m, "R2")
		g.store(v, "R3")
	})
}

// genSGDNEON emits sgdNEON: sgdScalar for every valid mode.
func (g *neonGen) genSGDNEON() {
	s := kernelSpec{name: "sgdNEON", rule: "SGD", ptrs: []string{"w", "grad", "buf"}, args: sgdArgCount}
	g.begin(s)
	modes, need := sgdModes(), sgdNeeds
	g.sections(s, modes, need, func(mode int, k []val) {
		w, d, t := vA0, vA1, vT0
		g.load(w, "R0", false)
		g.load(d, "R1", true)
		if mode&sgdWeightDecay != 0 {
			g.line("\t// d = (w*wd) + d")
			g.vop(opFMUL, t, w, k[sgdArgWeightDecay])
			if g.mutated("sgd/weight-decay-add-order") {
				g.vop(opFADD, d, d, t)
			} else {
				g.vop(opFADD, d, t, d)
			}
		}
		if mode&sgdMomentum != 0 {
			b := d // step 1: buf = d
			if mode&sgdLater != 0 {
				g.line("\t// buf = (buf*mom) + (d*damp)")
				b = vA2
				g.load(b, "R2", false)
				g.vop(opFMUL, b, b, k[sgdArgMomentum])
				if g.mutated("sgd/momentum-fma") {
					g.vop(opFMLA, b, d, k[sgdArgOneMinusDampening])
				} else {
					g.vop(opFMUL, t, d, k[sgdArgOneMinusDampening])
					g.vop(opFADD, b, b, t)
				}
			}
			g.store(b, "R2")
			if mode&sgdNesterov != 0 {
				g.line("\t// d = d + (buf*mom)")
				g.vop(opFMUL, t, b, k[sgdArgMomentum])
				if g.mutated("sgd/nesterov-add-order") {
					g.vop(opFADD, d, t, d)
				} else {
					g.vop(opFADD, d, d, t)
				}
			} else {
				d = b
			}
		}
		g.line("\t// w = w - d*lr")
		g.vop(opFMUL, t, d, k[sgdArgLR])
		g.vop(opFSUB, w, w, t)
		g.store(w, "R0")
	})
}

// genAdagradNEON emits adagradNEON: adagradScalar.
func (g *neonGen) genAdagradNEON() {
	s := kernelSpec{name: "adagradNEON", rule: "Adagrad", ptrs: []string{"w", "grad", "s"}, args: adagradArgCount}
	g.begin(s)
	need := func(m int) []int {
		c := []int{adagradArgNegCLR, adagradArgEps}
		if m&adagradWeightDecay != 0 {
			c = append(c, adagradArgWeightDecay)
		}
		return c
	}
	g.sections(s, []int{0, adagradWeightDecay}, need, func(mode int, k []val) {
		w, d, sum, t, q := vA0, vA1, vA2, vT0, vT1
		g.load(w, "R0", false)
		g.load(d, "R1", true)
		g.load(sum, "R2", false)
		if mode&adagradWeightDecay != 0 {
			g.line("\t// d = d + (w*wd)")
			g.vop(opFMUL, t, w, k[adagradArgWeightDecay])
			g.vop(opFADD, d, d, t)
		}
		g.line("\t// s = s + d*d")
		g.vop(opFMUL, t, d, d)
		if g.mutated("adagrad/sum-add-order") {
			g.vop(opFADD, sum, t, sum)
		} else {
			g.vop(opFADD, sum, sum, t)
		}
		g.line("\t// w = w + (d*nclr)/(sqrt(s) + eps)")
		g.vop(opFMUL, d, d, k[adagradArgNegCLR])
		g.vop(opFSQRT, t, sum, sum)
		g.vop(opFADD, t, t, k[adagradArgEps])
		if g.mutated("adagrad/divide-by-reciprocal") {
			g.vop(opFMOV1, q, q, q)
			g.vop(opFDIV, q, q, t)
			g.vop(opFMUL, d, d, q)
		} else {
			g.vop(opFDIV, d, d, t)
		}
		if g.mutated("adagrad/update-add-order") {
			g.vop(opFADD, w, d, w)
		} else {
			g.vop(opFADD, w, w, d)
		}
		g.store(w, "R0")
		g.store(sum, "R2")
	})
}

// genLionNEON emits lionNEON: lionScalar, its sign from comparisons and
// bit masks.
func (g *neonGen) genLionNEON() {
	s := kernelSpec{name: "lionNEON", rule: "Lion", ptrs: []string{"w", "grad", "m"}, args: lionArgCount}
	g.begin(s)
	need := func(m int) []int {
		c := []int{lionArgBeta1, lionArgOneMinusBeta1, lionArgBeta2, lionArgOneMinusBeta2, lionArgLR, lionArgOne, lionArgSignBit}
		if m&lionDecay != 0 {
			c = append(c, lionArgDecay)
		}
		return c
	}
	g.sections(s, []int{0, lionDecay}, need, func(mode int, k []val) {
		w, gr, mom, c, t, z, ord := vA0, vA1, vA2, vT0, vT1, vT2, vT3
		g.load(gr, "R1", true)
		g.load(mom, "R2", false)
		g.line("\t// c = (c1*g) + (m*b1)")
		g.vop(opFMUL, c, mom, k[lionArgBeta1])
		g.vop(opFMUL, t, k[lionArgOneMinusBeta1], gr)
		g.vop(opFADD, c, t, c)
		g.load(w, "R0", false)
		if mode&lionDecay != 0 {
			g.line("\t// w = decay*w")
			g.vop(opFMUL, w, k[lionArgDecay], w)
		}
		g.line("\t// u = sign(c): ±1 (c's sign bit on 1.0), +0 where c is ±0, c where c is NaN")
		g.bitop("VAND", k[lionArgSignBit], c, t)
		g.bitop("VORR", k[lionArgOne], t, t)
		g.vop(opFCMEQZ, z, c, c)
		if !g.mutated("lion/sign-of-zero-one") {
			g.vop(opBIC, t, t, z)
		}
		g.vop(opFCMEQ, ord, c, c)
		if !g.mutated("lion/sign-of-nan-one") {
			g.bitop("VBIF", ord, c, t) // t = c where ord is clear (c is NaN)
		}
		g.line("\t// w = w - u*lr")
		g.vop(opFMUL, t, t, k[lionArgLR])
		g.vop(opFSUB, w, w, t)
		g.store(w, "R0")
		g.line("\t// m = (c2*g) + (m*b2)")
		g.vop(opFMUL, mom, mom, k[lionArgBeta2])
		g.vop(opFMUL, t, k[lionArgOneMinusBeta2], gr)
		if g.mutated("lion/exp_avg-add-order") {
			g.vop(opFADD, mom, mom, t)
		} else {
			g.vop(opFADD, mom, t, mom)
		}
		g.store(mom, "R2")
	})
}

// neonMutations are the deviations the generator can build into the
// kernels (-mutate), for scripts/neon-mutants.sh to show that the
// differential tests catch each on arm64: an addition's operands swapped
// (a different NaN when both are NaN), a fused multiply-add, a divide
// through a reciprocal, the sign of ±0 or of a NaN, the last vector left
// out.
var neonMutations = []string{
	"adam/exp_avg-add-order", "adam/exp_avg-fma", "adam/divide-by-reciprocal",
	"sgd/weight-decay-add-order", "sgd/momentum-fma", "sgd/nesterov-add-order",
	"adagrad/sum-add-order", "adagrad/update-add-order", "adagrad/divide-by-reciprocal",
	"lion/sign-of-zero-one", "lion/sign-of-nan-one", "lion/exp_avg-add-order",
	"any/skips-last-vector",
}

// neonHeader is the first line of both generated files.
const neonHeader = "// Code generated by swapper/optimizer/internal/asmgen (go generate in swapper/optimizer). DO NOT EDIT."

// genNEON returns the arm64 assembly and Go declarations of the NEON
// kernels, with mutation built in (one of neonMutations, or "" for the
// faithful kernels).
func genNEON(mutation string) (asm, stubs []byte, err error) {
	g := &neonGen{mutation: mutation, used: map[string]bool{}}
	header := neonHeader
	if mutation != "" {
		header += "\n// MUTANT " + mutation + ": a deliberately wrong kernel for scripts/neon-mutants.sh."
	}
	g.line("%s\n\n//go:build arm64\n\n#include \"textflag.h\"", header)
	fmt.Fprintf(&g.stubs, "%s\n\n//go:build arm64\n\npackage optimizer\n", header)
	g.genAdamNEON()
	g.genSGDNEON()
	g.genAdagradNEON()
	g.genLionNEON()
	if mutation != "" && !g.used[mutation] {
		return nil, nil, fmt.Errorf("asmgen: unknown mutation %q (known: %s)", mutation, strings.Join(neonMutations, ", "))
	}
	return g.asm.Bytes(), g.stubs.Bytes(), nil
}

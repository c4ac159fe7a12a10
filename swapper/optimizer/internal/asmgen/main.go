// Command asmgen writes the assembly of the optimizer's SIMD kernels: for
// amd64 (AVX2, AVX-512) with avo, into ../../kernel_amd64.s and its Go
// declarations ../../kernel_amd64_stubs.go; with -neon, for arm64 (NEON)
// with its own small printer (neon.go), into ../../kernel_arm64.s and
// ../../kernel_arm64_stubs.go. Run it through go generate in
// swapper/optimizer:
//
//	cd swapper/optimizer && go generate
//
// -mutate NAME (with -neon) builds one deliberate deviation into the NEON
// kernels, for scripts/neon-mutants.sh to show that the arm64 differential
// tests catch it; -mutate list prints the names.
//
// It is its own module so that avo is a dependency of this generator only,
// never of zinf: the generated files are committed and build with nothing
// but the Go toolchain.
//
// Every kernel performs, lane by lane, exactly the operations of its
// rule's scalar reference loop (adamScalar, sgdScalar, adagradScalar,
// lionScalar in ../..) in the same order: separate multiply, add,
// subtract, divide and square root instructions, never a fused
// multiply-add or an approximate reciprocal, so each result is rounded
// exactly as the scalar operation rounds it. Where both operands of an
// addition could be NaN, the operand the compiled scalar loop puts first
// is first here too (x86 returns the first operand's NaN, quieted), so NaN
// payloads agree as well. Which one that is was read off the scalar
// loops' disassembly (go tool objdump) with Go 1.26; the differential
// tests (kernel_test.go, rules_kernel_test.go), whose NaNs carry random
// payloads, fail if a compiler release reorders them.
package main

import (
	"flag"
	"fmt"
	"os"
	"strings"

	. "github.com/mmcloughlin/avo/build"
	. "github.com/mmcloughlin/avo/operand"
	. "github.com/mmcloughlin/avo/reg"
)

// Indexes of the per-step constants in the args array: the order of
// argBeta1 ... argDecay in ../../adam.go.
const (
	argBeta1 = iota
	argOneMinusBeta1
	argBeta2
	argOneMinusBeta2
	argBC2Sqrt
	argEps
	argStepSize
	argL2
	argDecay
	argCount
)

// Weight-decay modes (decayNone, decayL2, decayAdamW in ../../adam.go).
const (
	decayNone  = 0
	decayL2    = 1
	decayAdamW = 2
)

// isa describes one instruction set's vectors.
type isa struct {
	name   string // function name suffix
	lanes  int    // float32 lanes per register
	unroll int    // Adam's vectors per loop iteration (the registers allow)
	vec    func() VecVirtual
	// masks: comparisons write opmask registers (AVX-512) rather than
	// all-ones lanes of a vector (AVX2).
	masks bool
}

func main() {
	neonOut := flag.String("neon", "", "write the arm64 NEON kernels to `file` (and not the amd64 ones)")
	neonStubs := flag.String("neonstubs", "", "write the NEON kernels' Go declarations to `file`")
	mutate := flag.String("mutate", "", "build the named deviation into the NEON kernels (list: print the names)")
	flag.Parse()
	if *mutate == "list" {
		fmt.Println(strings.Join(neonMutations, "\n"))
		return
	}
	if *neonOut != "" || *neonStubs != "" || *mutate != "" {
		if err := writeNEON(*neonOut, *neonStubs, *mutate); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		return
	}
	// The amd64 kernels, with avo (its flags: -out, -stubs, -pkg).
	ConstraintExpr("amd64")
	avx2 := isa{name: "AVX2", lanes: 8, unroll: 1, vec: YMM}
	avx512 := isa{name: "AVX512", lanes: 16, unroll: 2, vec: ZMM, masks: true}
	for _, s := range []isa{avx2, avx512} {
		genAdam(s)
	}
	for _, s := range []isa{avx2, avx512} {
		genSGD(s)
		genAdagrad(s)
		genLion(s)
	}
	for _, s := range []isa{avx2, avx512} {
		genAdam8(s)
	}
	Generate()
}

// writeNEON writes the NEON kernels (with mutation, if not "") to the
// files named (an empty name: that file is not written).
func writeNEON(asmPath, stubsPath, mutation string) error {
	if asmPath == "" && stubsPath == "" {
		return fmt.Errorf("asmgen: -mutate needs -neon or -neonstubs")
	}
	asm, stubs, err := genNEON(mutation)
	if err != nil {
		return err
	}
	if asmPath != "" {
		if err := os.WriteFile(asmPath, asm, 0o644); err != nil {
			return err
		}
	}
	if stubsPath != "" {
		if err := os.WriteFile(stubsPath, stubs, 0o644); err != nil {
			return err
		}
	}
	return nil
}

// genAdam emits adam<ISA>(p, g, m, v *float32, n int, args [9]float32,
// mode int), which updates elements [0, n) (n a positive multiple of
// lanes) in place. The constants come by value (broadcast from the
// argument frame), so a caller's args never escape to the heap through
// the kernel's function value.
func genAdam(s isa) {
	name := "adam" + s.name
	TEXT(name, NOSPLIT, fmt.Sprintf("func(p, grad, m, v *float32, n int, args [%d]float32, mode int)", argCount))
	Pragma("noescape")
	Doc(fmt.Sprintf("%s runs Adam on elements [0, n) of p, grad, m, v, %d lanes at a time; n must be a positive multiple of %d.", name, s.lanes, s.lanes))
	p := Load(Param("p"), GP64())
	g := Load(Param("grad"), GP64())
	m := Load(Param("m"), GP64())
	v := Load(Param("v"), GP64())
	n := Load(Param("n"), GP64())
	mode := Load(Param("mode"), GP64())

	Comment("n becomes the byte length; i is the byte offset of the next vector.")
	SHLQ(U8(2), n)
	i := GP64()
	XORQ(i, i)

	Comment("Broadcast the per-step constants.")
	k := make([]VecVirtual, argCount)
	for j := argBeta1; j <= argStepSize; j++ {
		k[j] = broadcast(s, j)
	}

	CMPQ(mode, U8(decayL2))
	JEQ(LabelRef(name + "_l2"))
	CMPQ(mode, U8(decayAdamW))
	JEQ(LabelRef(name + "_adamw"))
	loops(s, name+"_plain", decayNone, k, p, g, m, v, n, i)

	Label(name + "_l2")
	k[argL2] = broadcast(s, argL2)
	loops(s, name+"_l2", decayL2, k, p, g, m, v, n, i)

	Label(name + "_adamw")
	k[argDecay] = broadcast(s, argDecay)
	loops(s, name+"_adamw", decayAdamW, k, p, g, m, v, n, i)
}

// broadcast returns a vector holding element j of the args parameter in
// every lane.
func broadcast(s isa, j int) VecVirtual {
	arg, err := Param("args").Index(j).Resolve()
	if err != nil {
		panic(err)
	}
	v := s.vec()
	VBROADCASTSS(arg.Addr, v)
	return v
}

// loops emits Adam's loops for one weight-decay mode.
func loops(s isa, label string, mode int, k []VecVirtual, p, g, m, v, n, i Register) {
	emitLoops(s, s.unroll, label, n, i, func(disp int) { body(s, mode, k, p, g, m, v, i, disp) })
}

// emitLoops emits a loop over blocks of unroll vectors (when unroll > 1),
// a loop over the single vectors left, and the return; vec emits the
// update of one vector at byte offset i+disp. n is the byte length, i the
// byte offset of the next vector.
func emitLoops(s isa, unroll int, label string, n, i Register, vec func(disp int)) {
	vbytes := 4 * s.lanes
	if unroll > 1 {
		block := GP64()
		Comment(fmt.Sprintf("%d vectors per iteration while a whole block is left.", unroll))
		MOVQ(n, block)
		SUBQ(U32(unroll*vbytes), block)
		Label(label + "_block")
		CMPQ(i, block)
		JG(LabelRef(label + "_single"))
		for u := range unroll {
			vec(u * vbytes)
		}
		ADDQ(U32(unroll*vbytes), i)
		JMP(LabelRef(label + "_block"))
	}
	Label(label + "_single")
	CMPQ(i, n)
	JGE(LabelRef(label + "_done"))
	vec(0)
	ADDQ(U32(vbytes), i)
	JMP(LabelRef(label + "_single"))
	Label(label + "_done")
	VZEROUPPER()
	RET()
}

// body updates one vector of elements at byte offset i+disp. avo's
// operand order is Go's: the destination last, the first source (whose NaN
// x86 returns when both are NaN) just before it.
func body(s isa, mode int, k []VecVirtual, p, g, m, v, i Register, disp int) {
	at := func(base Register) Mem { return Mem{Base: base, Index: i, Scale: 1, Disp: disp} }
	vp, vg, vm, vv, t := s.vec(), s.vec(), s.vec(), s.vec(), s.vec()
	VMOVUPS(at(p), vp)
	VMOVUPS(at(g), vg)
	switch mode {
	case decayL2:
		VMULPS(vp, k[argL2], t) // t = l2*p
		VADDPS(t, vg, vg)       // g = g + t
	case decayAdamW:
		VMULPS(k[argDecay], vp, vp) // p = p*decay
	}
	// m = b1*m + c1*g, the c1*g term first as in the compiled scalar loop.
	VMULPS(at(m), k[argBeta1], vm)
	VMULPS(k[argOneMinusBeta1], vg, t)
	VADDPS(vm, t, vm)
	// v = b2*v + (c2*g)*g, the (c2*g)*g term first, g first in its product.
	VMULPS(at(v), k[argBeta2], vv)
	VMULPS(k[argOneMinusBeta2], vg, t)
	VMULPS(t, vg, t)
	VADDPS(vv, t, vv)
	// denom = sqrt(v)/bc2sqrt + eps
	VSQRTPS(vv, t)
	VDIVPS(k[argBC2Sqrt], t, t)
	VADDPS(k[argEps], t, t)
	// p = p - stepSize*(m/denom)
	VDIVPS(t, vm, vg)
	VMULPS(k[argStepSize], vg, vg)
	VSUBPS(vg, vp, vp)
	VMOVUPS(vp, at(p))
	VMOVUPS(vm, at(m))
	VMOVUPS(vv, at(v))
}

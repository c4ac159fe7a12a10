package main

// Encoders of the Advanced SIMD instructions the block formats' NEON
// kernels need and Go's arm64 assembler does not know. Each returns the
// instruction's 32-bit word (Arm Architecture Reference Manual, A64
// Advanced SIMD) and its text, which the printer writes as a comment
// beside the WORD; neonenc_test.go holds the words to an assembler's.

import "fmt"

// vreg checks a vector register number.
func vreg(r int) uint32 {
	if r < 0 || r > 31 {
		panic(fmt.Sprintf("asmgen: vector register V%d", r))
	}
	return uint32(r)
}

// rrr places the three registers of a three-register instruction.
func rrr(op uint32, d, n, m int) uint32 { return op | vreg(m)<<16 | vreg(n)<<5 | vreg(d) }

// encSMULL is SMULL Vd.8H, Vn.8B, Vm.8B (the low eight bytes), or with
// high SMULL2 Vd.8H, Vn.16B, Vm.16B (the high eight): the signed products
// of the bytes, widened to 16 bits; unsigned makes it UMULL(2).
func encSMULL(d, n, m int, high, unsigned bool) (uint32, string) {
	op, name, src := uint32(0x0e20c000), "smull", "8b"
	if high {
		op, name, src = op|1<<30, name+"2", "16b"
	}
	if unsigned {
		op, name = op|1<<29, "u"+name[1:]
	}
	return rrr(op, d, n, m), fmt.Sprintf("%s v%d.8h, v%d.%s, v%d.%s", name, d, n, src, m, src)
}

// encSADDLP is SADDLP Vd.4S, Vn.8H: the sums of adjacent pairs of signed
// halves, widened to 32 bits.
func encSADDLP(d, n int) (uint32, string) {
	return rrr(0x4e602800, d, n, 0), fmt.Sprintf("saddlp v%d.4s, v%d.8h", d, n)
}

// encSDOT is SDOT Vd.4S, Vn.16B, Vm.16B (ARMv8.2 dot product): lane i of
// Vd plus the signed products of bytes 4i..4i+3 of Vn and Vm; unsigned
// makes it UDOT.
func encSDOT(d, n, m int, unsigned bool) (uint32, string) {
	op, name := uint32(0x4e809400), "sdot"
	if unsigned {
		op, name = op|1<<29, "udot"
	}
	return rrr(op, d, n, m), fmt.Sprintf("%s v%d.4s, v%d.16b, v%d.16b", name, d, n, m)
}

// encSCVTF is SCVTF Vd.4S, Vn.4S: signed 32-bit integers to binary32
// (exact below 2^24).
func encSCVTF(d, n int) (uint32, string) {
	return rrr(0x4e21d800, d, n, 0), fmt.Sprintf("scvtf v%d.4s, v%d.4s", d, n)
}

// encFMLAElem is FMLA Vd.4S, Vn.4S, Vm.S[0]: Vd plus Vn times Vm's lane
// 0, one rounding (FMA32).
func encFMLAElem(d, n, m int) (uint32, string) {
	return rrr(0x4f801000, d, n, m), fmt.Sprintf("fmla v%d.4s, v%d.4s, v%d.s[0]", d, n, m)
}

// encFMULElem is FMUL Vd.4S, Vn.4S, Vm.S[0].
func encFMULElem(d, n, m int) (uint32, string) {
	return rrr(0x4f809000, d, n, m), fmt.Sprintf("fmul v%d.4s, v%d.4s, v%d.s[0]", d, n, m)
}

// encFADD is FADD Vd.4S, Vn.4S, Vm.4S.
func encFADD(d, n, m int) (uint32, string) {
	return rrr(0x4e20d400, d, n, m), fmt.Sprintf("fadd v%d.4s, v%d.4s, v%d.4s", d, n, m)
}

// encSXTL is SXTL Vd.4S, Vn.4H (SSHLL #0: the low four signed halves
// widened to 32 bits), or with high SXTL2 Vd.4S, Vn.8H (the high four).
func encSXTL(d, n int, high bool) (uint32, string) {
	if high {
		return rrr(0x4f10a400, d, n, 0), fmt.Sprintf("sshll2 v%d.4s, v%d.8h, #0", d, n)
	}
	return rrr(0x0f10a400, d, n, 0), fmt.Sprintf("sshll v%d.4s, v%d.4h, #0", d, n)
}

//go:build amd64

#include "textflag.h"

// func cpuid7ECX() uint32
TEXT ·cpuid7ECX(SB), NOSPLIT, $0-4
	MOVL  $7, AX
	XORL  CX, CX
	CPUID
	MOVL  CX, ret+0(FP)
	RET

// FOLD folds the 2x128 bits of acc by the distance of the constants in K
// (each 128-bit lane: low half times K's low, high half times K's high)
// and adds (XOR) in; tmp is scratch.
#define FOLD(K, acc, in, tmp) \
	VPCLMULQDQ $0x00, K, acc, tmp \
	VPCLMULQDQ $0x11, K, acc, acc \
	VPXOR      in, tmp, tmp       \
	VPXOR      tmp, acc, acc

// func foldVPCLMUL(crc uint32, b []byte) uint32
TEXT ·foldVPCLMUL(SB), NOSPLIT, $0-36
	MOVL crc+0(FP), DX
	MOVQ b_base+8(FP), SI
	MOVQ b_len+16(FP), CX

	// The first 128 bytes, with crc added to their first 32 bits.
	VMOVDQU 0(SI), Y0
	VMOVDQU 32(SI), Y1
	VMOVDQU 64(SI), Y2
	VMOVDQU 96(SI), Y3
	VMOVD   DX, X4
	VPXOR   Y4, Y0, Y0
	ADDQ    $128, SI
	SUBQ    $128, CX

	// Fold each 128-bit lane by 1024 bits onto the next 128 bytes.
	VBROADCASTI128 ·foldK+0(SB), Y8

loop:
	CMPQ CX, $128
	JB   reduce
	FOLD(Y8, Y0, 0(SI), Y4)
	FOLD(Y8, Y1, 32(SI), Y5)
	FOLD(Y8, Y2, 64(SI), Y6)
	FOLD(Y8, Y3, 96(SI), Y7)
	ADDQ $128, SI
	SUBQ $128, CX
	JMP  loop

reduce:
	// Y0, Y1 and Y2 onto Y3: 768, 512 and 256 bits.
	VBROADCASTI128 ·foldK+16(SB), Y8
	VPCLMULQDQ     $0x00, Y8, Y0, Y4
	VPCLMULQDQ     $0x11, Y8, Y0, Y0
	VBROADCASTI128 ·foldK+32(SB), Y9
	VPCLMULQDQ     $0x00, Y9, Y1, Y5
	VPCLMULQDQ     $0x11, Y9, Y1, Y1
	VBROADCASTI128 ·foldK+48(SB), Y10
	VPCLMULQDQ     $0x00, Y10, Y2, Y6
	VPCLMULQDQ     $0x11, Y10, Y2, Y2
	VPXOR          Y4, Y0, Y0
	VPXOR          Y5, Y1, Y1
	VPXOR          Y6, Y2, Y2
	VPXOR          Y0, Y1, Y1
	VPXOR          Y2, Y3, Y3
	VPXOR          Y1, Y3, Y3

	// Y3's low lane onto its high one: 128 bits.
	VEXTRACTI128 $1, Y3, X1
	VMOVDQU      ·foldK+64(SB), X8
	VPCLMULQDQ   $0x00, X8, X3, X4
	VPCLMULQDQ   $0x11, X8, X3, X3
	VPXOR        X4, X3, X3
	VPXOR        X1, X3, X3

	// X3 is X, 128 bits; the CRC register is X*x^32 mod P. T = X_hi*x^96
	// + X_lo*x^32 (mod P) in 96 bits, then U = T_hi*x^64 + T_lo in 64
	// bits, in the high half of X4.
	VMOVDQU    ·foldK+80(SB), X8
	VPCLMULQDQ $0x00, X8, X3, X4
	VPSRLDQ    $8, X3, X5
	VPSLLDQ    $4, X5, X5
	VPXOR      X5, X4, X4
	VPCLMULQDQ $0x10, X8, X4, X5
	VPXOR      X5, X4, X4
	VPSRLDQ    $8, X4, X4

	// Barrett: q = floor(U_hi * floor(x^64/P) / x^32), U mod P = U + q*P
	// in its low 32 bits (the high dword of X5 here).
	VMOVDQU    ·foldK+96(SB), X8
	VPXOR      X6, X6, X6
	VPBLENDD   $1, X4, X6, X5
	VPCLMULQDQ $0x00, X8, X5, X5
	VPBLENDD   $1, X5, X6, X5
	VPCLMULQDQ $0x10, X8, X5, X5
	VPXOR      X4, X5, X5
	VPEXTRD    $1, X5, AX
	MOVL       AX, ret+32(FP)
	VZEROUPPER
	RET

//go:build amd64

#include "textflag.h"

// func addAVX2(acc, grad *float32, n int)
// Requires: AVX2. n is a multiple of 16: each iteration adds two vectors
// of 8 (VADDPS, rounded as the scalar ADDSS of the Go loop).
TEXT ·addAVX2(SB), NOSPLIT, $0-24
	MOVQ acc+0(FP), DI
	MOVQ grad+8(FP), SI
	MOVQ n+16(FP), CX
	SHRQ $4, CX
	JZ   adone

aloop:
	VMOVUPS (DI), Y0
	VMOVUPS 32(DI), Y1
	VADDPS  (SI), Y0, Y0
	VADDPS  32(SI), Y1, Y1
	VMOVUPS Y0, (DI)
	VMOVUPS Y1, 32(DI)
	ADDQ    $64, SI
	ADDQ    $64, DI
	DECQ    CX
	JNZ     aloop
	VZEROUPPER

adone:
	RET

// func plusZeroNTAVX2(dst, src *float32, n int)
// Requires: AVX2. n is a multiple of 16; dst is 32-byte aligned. dst[i] =
// src[i] + (+0): a -0 becomes +0, as adding to a zeroed sum would; every
// other value keeps its bits. Non-temporal stores (VMOVNTPS: no read for
// ownership of the destination's lines); SFENCE orders them before the
// return.
TEXT ·plusZeroNTAVX2(SB), NOSPLIT, $0-24
	MOVQ   dst+0(FP), DI
	MOVQ   src+8(FP), SI
	MOVQ   n+16(FP), CX
	SHRQ   $4, CX
	JZ     zdone
	VXORPS Y2, Y2, Y2

zloop:
	VADDPS   (SI), Y2, Y0
	VADDPS   32(SI), Y2, Y1
	VMOVNTPS Y0, (DI)
	VMOVNTPS Y1, 32(DI)
	ADDQ     $64, SI
	ADDQ     $64, DI
	DECQ     CX
	JNZ      zloop
	SFENCE
	VZEROUPPER

zdone:
	RET

// func addPairAVX2(acc, a, b *float32, n int)
// Requires: AVX2. n is a multiple of 16: acc[i] = (acc[i] + a[i]) + b[i],
// two VADDPS in that order (the bits of two scalar passes).
TEXT ·addPairAVX2(SB), NOSPLIT, $0-32
	MOVQ acc+0(FP), DI
	MOVQ a+8(FP), SI
	MOVQ b+16(FP), DX
	MOVQ n+24(FP), CX
	SHRQ $4, CX
	JZ   pdone

ploop:
	VMOVUPS (DI), Y0
	VMOVUPS 32(DI), Y1
	VADDPS  (SI), Y0, Y0
	VADDPS  32(SI), Y1, Y1
	VADDPS  (DX), Y0, Y0
	VADDPS  32(DX), Y1, Y1
	VMOVUPS Y0, (DI)
	VMOVUPS Y1, 32(DI)
	ADDQ    $64, SI
	ADDQ    $64, DX
	ADDQ    $64, DI
	DECQ    CX
	JNZ     ploop
	VZEROUPPER

pdone:
	RET

// func plusZeroPairNTAVX2(dst, a, b *float32, n int)
// Requires: AVX2. n is a multiple of 16; dst is 32-byte aligned. dst[i] =
// (a[i] + (+0)) + b[i] with non-temporal stores (see plusZeroNTAVX2);
// SFENCE orders them before the return.
TEXT ·plusZeroPairNTAVX2(SB), NOSPLIT, $0-32
	MOVQ   dst+0(FP), DI
	MOVQ   a+8(FP), SI
	MOVQ   b+16(FP), DX
	MOVQ   n+24(FP), CX
	SHRQ   $4, CX
	JZ     qdone
	VXORPS Y2, Y2, Y2

qloop:
	VADDPS   (SI), Y2, Y0
	VADDPS   32(SI), Y2, Y1
	VADDPS   (DX), Y0, Y0
	VADDPS   32(DX), Y1, Y1
	VMOVNTPS Y0, (DI)
	VMOVNTPS Y1, 32(DI)
	ADDQ     $64, SI
	ADDQ     $64, DX
	ADDQ     $64, DI
	DECQ     CX
	JNZ      qloop
	SFENCE
	VZEROUPPER

qdone:
	RET

//go:build amd64

#include "textflag.h"

// func widenBF16AVX2(dst *float32, src *BFloat16, n int)
// Requires: AVX2. n is a multiple of 16: each iteration zero-extends 16
// uint16s to uint32s (VPMOVZXWD) and shifts them into the upper halves
// (VPSLLD $16): a bfloat16's bits are its float32's upper 16 bits.
TEXT ·widenBF16AVX2(SB), NOSPLIT, $0-24
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ n+16(FP), CX
	SHRQ $4, CX
	JZ   done

loop:
	VPMOVZXWD (SI), Y0
	VPMOVZXWD 16(SI), Y1
	VPSLLD    $16, Y0, Y0
	VPSLLD    $16, Y1, Y1
	VMOVDQU   Y0, (DI)
	VMOVDQU   Y1, 32(DI)
	ADDQ      $32, SI
	ADDQ      $64, DI
	DECQ      CX
	JNZ       loop
	VZEROUPPER

done:
	RET

// func widenBF16AVX2NT(dst *float32, src *BFloat16, n int)
// Requires: AVX2. As widenBF16AVX2, with non-temporal stores (VMOVNTDQ:
// no read for ownership of the destination's lines, which a widening far
// larger than the caches would otherwise pay for every line it writes);
// dst is 32-byte aligned. SFENCE orders the stores before the return.
TEXT ·widenBF16AVX2NT(SB), NOSPLIT, $0-24
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ n+16(FP), CX
	SHRQ $4, CX
	JZ   ntdone

ntloop:
	VPMOVZXWD (SI), Y0
	VPMOVZXWD 16(SI), Y1
	VPSLLD    $16, Y0, Y0
	VPSLLD    $16, Y1, Y1
	VMOVNTDQ  Y0, (DI)
	VMOVNTDQ  Y1, 32(DI)
	ADDQ      $32, SI
	ADDQ      $64, DI
	DECQ      CX
	JNZ       ntloop
	SFENCE
	VZEROUPPER

ntdone:
	RET

// func narrowBF16AVX2(dst *BFloat16, src *float32, n int)
// Requires: AVX2. n is a multiple of 16. Each float32 u rounds to the
// nearest bfloat16, ties to even, as BFloat16FromFloat32 does:
// (u + 0x7fff + (u>>16 & 1)) >> 16, and a NaN (|u| > 0x7f800000) becomes
// u>>16 | 0x0040 (VPBLENDVB picks it where VPCMPGTD found one). VPACKUSDW
// packs two vectors of 8 results (each <= 0xffff, so no saturation) per
// 128-bit lane; VPERMQ $0xd8 puts the lanes back in order.
TEXT ·narrowBF16AVX2(SB), NOSPLIT, $0-24
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ n+16(FP), CX
	SHRQ $4, CX
	JZ   ndone
	MOVL         $1, AX
	VMOVD        AX, X10
	VPBROADCASTD X10, Y10
	MOVL         $0x7fff, AX
	VMOVD        AX, X11
	VPBROADCASTD X11, Y11
	MOVL         $0x7fffffff, AX
	VMOVD        AX, X12
	VPBROADCASTD X12, Y12
	MOVL         $0x7f800000, AX
	VMOVD        AX, X13
	VPBROADCASTD X13, Y13
	MOVL         $0x40, AX
	VMOVD        AX, X14
	VPBROADCASTD X14, Y14

nloop:
	VMOVDQU   (SI), Y0
	VMOVDQU   32(SI), Y1
	VPSRLD    $16, Y0, Y2
	VPAND     Y10, Y2, Y3
	VPADDD    Y11, Y3, Y3
	VPADDD    Y3, Y0, Y3
	VPSRLD    $16, Y3, Y3
	VPOR      Y14, Y2, Y2
	VPAND     Y12, Y0, Y4
	VPCMPGTD  Y13, Y4, Y4
	VPBLENDVB Y4, Y2, Y3, Y5
	VPSRLD    $16, Y1, Y2
	VPAND     Y10, Y2, Y3
	VPADDD    Y11, Y3, Y3
	VPADDD    Y3, Y1, Y3
	VPSRLD    $16, Y3, Y3
	VPOR      Y14, Y2, Y2
	VPAND     Y12, Y1, Y4
	VPCMPGTD  Y13, Y4, Y4
	VPBLENDVB Y4, Y2, Y3, Y6
	VPACKUSDW Y6, Y5, Y7
	VPERMQ    $0xd8, Y7, Y7
	VMOVDQU   Y7, (DI)
	ADDQ      $64, SI
	ADDQ      $32, DI
	DECQ      CX
	JNZ       nloop
	VZEROUPPER

ndone:
	RET

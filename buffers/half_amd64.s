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

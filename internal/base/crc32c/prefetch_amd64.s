//go:build amd64

#include "textflag.h"

// func prefetchT0(p *byte, n int)
// One PREFETCHT0 per 64-byte line of [p, p+n): a hint, which neither
// faults nor waits for the line.
TEXT ·prefetchT0(SB), NOSPLIT, $0-16
	MOVQ p+0(FP), AX
	MOVQ n+8(FP), CX

loop:
	CMPQ       CX, $0
	JLE        done
	PREFETCHT0 (AX)
	ADDQ       $64, AX
	SUBQ       $64, CX
	JMP        loop

done:
	RET

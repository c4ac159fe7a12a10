package crc32c

import "golang.org/x/sys/cpu"

// cpuid7ECX returns ECX of CPUID leaf 7, subleaf 0. Written in
// fold_amd64.s.
func cpuid7ECX() uint32

// foldVPCLMUL returns the CRC-32C register after b (crc32.Update's crc
// inverted), starting from crc (a register too). len(b) is a multiple of
// foldBlock, at least foldBlock. Written in fold_amd64.s.
//
// It is the folding of Intel's "Fast CRC Computation for Generic
// Polynomials Using PCLMULQDQ Instruction", for a reflected CRC, on YMM
// registers. Four hold the first 128 bytes, crc added to their first 32
// bits; each round multiplies the two 64-bit halves of each 128-bit lane
// by x^(1024+64) and x^1024 mod P, the 128 bytes the lane moves on, and
// adds the next 128 bytes. At the end the four registers fold onto the
// last (768, 512 and 256 bits), its low lane onto its high one (128), the
// 128 bits to 64 (x^96 and x^64), and a Barrett reduction leaves the
// 32-bit remainder. It needs AVX2 and the VEX-encoded 256-bit VPCLMULQDQ,
// and no AVX-512 (no EVEX instruction): see canFold.
//
// On the test machine (2 vCPUs of an AMD EPYC, AVX2 and VPCLMULQDQ
// without AVX-512) a 256-bit VPCLMULQDQ issues about every 2 cycles, which
// bounds the loop at 16 bytes a VPCLMULQDQ, about what CRC32Q (hash/crc32)
// does in the cache: Checksum ran at 17.3 GB/s on 1 MiB units of a 1 GiB
// buffer and 18.5 GB/s in the cache, where hash/crc32 ran at 6.7 and 17.5
// GB/s and Update without the kernel at 7.4 and 14.1 (medians of 5 of
// go test -run '^$' -bench 'Checksum/memory' -benchtime 5x -count 5, and
// of 'Checksum/cache' at -benchtime 200ms). A PREFETCHT0 512, 2048 or
// 8192 bytes ahead in the loop made no difference that the runs' spread
// showed, so there is none; nor did starting the loads on 32 bytes (the
// head to hash/crc32).
//
//go:noescape
func foldVPCLMUL(crc uint32, b []byte) uint32

// canFold: the CPU and OS run foldVPCLMUL: AVX2 with the OS saving the
// YMM registers (x/sys/cpu's HasAVX2 checks XGETBV), PCLMULQDQ, and the
// 256-bit VPCLMULQDQ (CPUID leaf 7 ECX bit 10, which x/sys/cpu reports
// only with AVX-512; this project's test machine has it without). AVX2
// is asked first: it is in leaf 7 too, so leaf 7 exists.
var canFold = cpu.X86.HasOSXSAVE && cpu.X86.HasAVX2 && cpu.X86.HasPCLMULQDQ &&
	cpuid7ECX()&(1<<10) != 0

// haveFold is whether Update folds: canFold, unless a test turned it off
// to run the other path.
var haveFold = canFold

// foldK holds foldVPCLMUL's constants, pairs of 64-bit lanes (one XMM
// register each, broadcast to both halves of a YMM one for the folds).
// P is the Castagnoli polynomial (x^32 + 0x1EDC6F41), and a register's
// bit i is the coefficient of x^(63-i) (the reflected order the CRC's
// bytes come in), so rev64(v) is the polynomial v written that way. A
// carry-less product of two such 64-bit lanes is their product times x
// in a 128-bit register, hence the exponents one short of the distance:
//
//	fold by d bits: {rev64(x^(d+63) mod P), rev64(x^(d-1) mod P)}
//	128 to 64 bits: {rev64(x^95 mod P), rev64(x^63 mod P)}
//	Barrett:        {rev33(floor(x^64 / P)), rev33(P)}
//
// where rev33(v) = rev64(v) >> 31. TestFoldConstants derives them bit by
// bit.
var foldK = [14]uint64{
	0: 0x6577b245_00000000, 1: 0x7417153f_00000000, // fold 1024 (the loop)
	2: 0xc92f998d_00000000, 3: 0x3365346a_00000000, // fold 768
	4: 0x1c19243b_00000000, 5: 0x75bba45b_00000000, // fold 512
	6: 0x33ccbbbc_00000000, 7: 0xa2158b34_00000000, // fold 256
	8: 0x3743f7bd_00000000, 9: 0x3171d430_00000000, // fold 128
	10: 0x493c7d27_00000000, 11: 0xdd45aab8_00000000, // 128 to 64
	12: 0x00000000_dea713f1, 13: 0x00000001_05ec76f1, // Barrett
}

// foldBlock is what foldVPCLMUL's loop sums a round: four YMM registers.
const foldBlock = 128

// Package crc32c is the CRC-32C (Castagnoli) of zinf's swap stores and
// checkpoints, with the bits of hash/crc32's Castagnoli table: the same
// function, faster on buffers far larger than the caches.
//
// A swap store checksums what the disk just wrote into memory (a read) or
// what the optimizer wrote long enough ago that the caches no longer hold
// it (a write), so the CRC reads memory, not cache: hash/crc32 runs at
// 13-17 GB/s on this project's test machine from the cache and 5-6 GB/s
// from memory.
//
// Where the CPU has AVX2 and the 256-bit VPCLMULQDQ (fold_amd64.go), Update
// sums a buffer of 256 bytes or more with a kernel that folds it by
// carry-less multiplication, in its largest multiple of 128 bytes, and
// hash/crc32 sums the rest: on the test machine 17.3 GB/s from memory
// and 18.5 GB/s from the cache (hash/crc32 6.7 and 17.5; medians of 5,
// BenchmarkChecksum). The kernel reads one stream of 32-byte loads, which
// the hardware prefetches well without help.
//
// Elsewhere Update walks a long buffer in chunks and asks for the chunks
// ahead of the one it sums (PREFETCHT0 on amd64), which the hardware's own
// prefetching does not fully do for the CRC instructions' access pattern:
// 7.4 GB/s from memory on the test machine.
package crc32c

import (
	"hash/crc32"

	"github.com/zinfio/zinf/internal/base/yield"
)

// table is hash/crc32's Castagnoli table (its SSE4.2 code on amd64).
var table = crc32.MakeTable(crc32.Castagnoli)

const (
	// chunk is what one hash/crc32 call sums.
	chunk = 4 << 10
	// ahead is how far past the chunk being summed the prefetches reach.
	ahead = 16 << 10
	// longBytes is the length from which Update prefetches: below it the
	// buffer is as likely in the cache, and the calls would only add.
	longBytes = 64 << 10
	// foldMin is the length from which Update folds (where haveFold): at
	// 128 and 256 bytes the kernel and hash/crc32 took the same time on
	// the test machine (about 18 and 26 ns), from 384 the kernel less
	// (29 ns against 41).
	foldMin = 256
)

// Checksum returns the CRC-32C of b (crc32.Checksum(b,
// crc32.MakeTable(crc32.Castagnoli))).
func Checksum(b []byte) uint32 { return Update(0, b) }

// Update returns crc updated with b (crc32.Update with the Castagnoli
// table). While compute is marked (package yield), a long b is summed in
// chunks of yield.Chunk with a yield.Point between them.
func Update(crc uint32, b []byte) uint32 {
	if len(b) > 2*yield.Chunk && yield.Active() {
		for len(b) > yield.Chunk {
			crc = update(crc, b[:yield.Chunk])
			b = b[yield.Chunk:]
			yield.Point()
		}
	}
	return update(crc, b)
}

// update is Update without the yield points.
func update(crc uint32, b []byte) uint32 {
	if haveFold && len(b) >= foldMin {
		// The kernel takes and returns the register crc32.Update keeps,
		// which is crc inverted.
		n := len(b) &^ (foldBlock - 1)
		crc = ^foldVPCLMUL(^crc, b[:n])
		return crc32.Update(crc, table, b[n:])
	}
	if len(b) < longBytes || !havePrefetch {
		return crc32.Update(crc, table, b)
	}
	prefetch(b[:ahead])
	for len(b) > chunk {
		if len(b) > ahead+chunk {
			prefetch(b[ahead : ahead+chunk])
		}
		crc = crc32.Update(crc, table, b[:chunk])
		b = b[chunk:]
	}
	return crc32.Update(crc, table, b)
}

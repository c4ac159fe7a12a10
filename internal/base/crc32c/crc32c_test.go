package crc32c_test

import (
	"hash/crc32"
	"math/rand/v2"
	"testing"

	"github.com/zinfio/zinf/internal/base/crc32c"
)

// TestMatchesHashCRC32: Checksum and Update give hash/crc32's Castagnoli
// CRC at lengths around the chunking (4 KiB chunks, prefetching from 64
// KiB) and at every offset of a word, whole and split in two updates.
func TestMatchesHashCRC32(t *testing.T) {
	tab := crc32.MakeTable(crc32.Castagnoli)
	r := rand.New(rand.NewPCG(3, 4))
	buf := make([]byte, 1<<20+64)
	for i := range buf {
		buf[i] = byte(r.Uint32())
	}
	for _, n := range []int{0, 1, 7, 4095, 4096, 4097, 64<<10 - 1, 64 << 10, 64<<10 + 1, 80<<10 + 3, 1 << 20} {
		for off := range 8 {
			b := buf[off : off+n]
			want := crc32.Checksum(b, tab)
			if got := crc32c.Checksum(b); got != want {
				t.Fatalf("%d bytes at offset %d: Checksum %08x, hash/crc32 %08x", n, off, got, want)
			}
			cut := n / 3
			if got := crc32c.Update(crc32c.Update(0, b[:cut]), b[cut:]); got != want {
				t.Fatalf("%d bytes at offset %d in two updates (%d + %d): %08x, hash/crc32 %08x", n, off, cut, n-cut, got, want)
			}
		}
	}
}

// BenchmarkChecksum compares Checksum with hash/crc32 on 1 MiB units of a
// 1 GiB buffer (memory, not cache: a swap store's case) and on a buffer
// the caches hold. Run with -count and compare the medians: this
// machine's memory is shared.
func BenchmarkChecksum(b *testing.B) {
	tab := crc32.MakeTable(crc32.Castagnoli)
	for _, c := range []struct {
		name        string
		total, unit int
	}{{"memory", 1 << 30, 1 << 20}, {"cache", 256 << 10, 64 << 10}} {
		buf := make([]byte, c.total)
		for i := range buf {
			buf[i] = byte(i * 7)
		}
		run := func(b *testing.B, f func([]byte) uint32) {
			b.SetBytes(int64(c.total))
			for b.Loop() {
				for o := 0; o < c.total; o += c.unit {
					f(buf[o : o+c.unit])
				}
			}
		}
		b.Run(c.name+"/crc32c", func(b *testing.B) { run(b, crc32c.Checksum) })
		b.Run(c.name+"/hash-crc32", func(b *testing.B) { run(b, func(p []byte) uint32 { return crc32.Checksum(p, tab) }) })
	}
}

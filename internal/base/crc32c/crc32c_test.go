package crc32c_test

import (
	"fmt"
	"hash/crc32"
	"math/rand/v2"
	"testing"

	"github.com/zinfio/zinf/internal/base/crc32c"
	"github.com/zinfio/zinf/internal/base/yield"
)

var tab = crc32.MakeTable(crc32.Castagnoli)

// paths runs f on Update's folding path (where this CPU has the kernel)
// and on the other one (hash/crc32 with the prefetching), so that both
// stay tested on a machine that folds.
func paths(t *testing.T, f func(t *testing.T)) {
	for _, fold := range []bool{true, false} {
		name := "nofold"
		if fold {
			name = "fold"
		}
		t.Run(name, func(t *testing.T) {
			if fold && !crc32c.CanFold() {
				t.Skip("no AVX2 with 256-bit VPCLMULQDQ here: only the other path runs")
			}
			defer crc32c.SetFold(crc32c.SetFold(fold))
			f(t)
		})
	}
}

// randomBytes returns n bytes of a fixed pseudo-random stream.
func randomBytes(n int, seed uint64) []byte {
	r := rand.New(rand.NewPCG(seed, seed+1))
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}

// check fails t unless Update(crc, b), and Checksum(b) where crc is 0,
// are hash/crc32's.
func check(t *testing.T, what string, crc uint32, b []byte) {
	t.Helper()
	want := crc32.Update(crc, tab, b)
	if got := crc32c.Update(crc, b); got != want {
		t.Fatalf("%s: Update(%08x, %d bytes) = %08x, hash/crc32 %08x", what, crc, len(b), got, want)
	}
	if crc == 0 {
		if got := crc32c.Checksum(b); got != want {
			t.Fatalf("%s: Checksum(%d bytes) = %08x, hash/crc32 %08x", what, len(b), got, want)
		}
	}
}

// TestMatchesHashCRC32: Checksum and Update give hash/crc32's Castagnoli
// CRC at lengths around the chunking (4 KiB chunks, prefetching from 64
// KiB) and at every offset of a word, whole and split in two updates.
func TestMatchesHashCRC32(t *testing.T) {
	buf := randomBytes(1<<20+64, 3)
	paths(t, func(t *testing.T) {
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
	})
}

// TestEveryLengthAndOffset: every length 0..2048 at every offset 0..31 of
// random bytes, from 0 and from a random crc: the kernel's minimum, each
// multiple of its block and every tail length in between.
func TestEveryLengthAndOffset(t *testing.T) {
	buf := randomBytes(2048+32, 5)
	r := rand.New(rand.NewPCG(7, 8))
	paths(t, func(t *testing.T) {
		for n := 0; n <= 2048; n++ {
			for off := range 32 {
				b := buf[off : off+n]
				what := fmt.Sprintf("offset %d", off)
				check(t, what, 0, b)
				check(t, what, r.Uint32(), b)
			}
		}
	})
}

// lengths are those around each threshold: the kernel's minimum and
// block, hash/crc32's and the prefetch's chunking, large buffers.
func lengths() []int {
	var ns []int
	around := func(n int) {
		for d := -2; d <= 2; d++ {
			if n+d >= 0 {
				ns = append(ns, n+d)
			}
		}
	}
	around(crc32c.FoldMin)
	for k := 1; k <= 10; k++ {
		around(k * crc32c.FoldBlock)
	}
	around(2*crc32c.FoldMin - 1)
	around(4 << 10)     // the prefetch's chunk
	around(20 << 10)    // its chunk plus its distance ahead
	around(64 << 10)    // where it starts
	around(1 << 20)     // a swap unit
	around(4<<20 + 333) // 4 MiB and an odd tail
	return ns
}

// TestThresholds: the lengths around every threshold, at a few offsets,
// from a few crcs, of random bytes, all-zero bytes and all-0xFF bytes.
func TestThresholds(t *testing.T) {
	const most = 4<<20 + 333 + 2 + 32
	ones := make([]byte, most)
	for i := range ones {
		ones[i] = 0xFF
	}
	data := []struct {
		name string
		buf  []byte
	}{{"random", randomBytes(most, 9)}, {"zero", make([]byte, most)}, {"0xFF", ones}}
	paths(t, func(t *testing.T) {
		for _, d := range data {
			for _, n := range lengths() {
				for _, off := range []int{0, 1, 13, 31} {
					for _, crc := range []uint32{0, 0xFFFFFFFF, 0x12345678} {
						check(t, fmt.Sprintf("%s at offset %d", d.name, off), crc, d.buf[off:off+n])
					}
				}
			}
		}
	})
}

// TestSplitUpdates: Update chained over two and three pieces of a buffer,
// cut on and off the kernel's blocks, is hash/crc32 of the whole.
func TestSplitUpdates(t *testing.T) {
	buf := randomBytes(4<<20+333, 11)
	paths(t, func(t *testing.T) {
		for _, n := range []int{300, 700, 3000, 1<<20 + 13, 4<<20 + 333} {
			b := buf[:n]
			want := crc32.Checksum(b, tab)
			cuts := []int{0, 1, 127, 128, 129, 255, 256, 257, 1000, n / 3, n / 2, n - 257, n - 256, n - 1, n}
			for _, c := range cuts {
				if c < 0 || c > n {
					continue
				}
				if got := crc32c.Update(crc32c.Update(0, b[:c]), b[c:]); got != want {
					t.Fatalf("%d bytes cut at %d: %08x, hash/crc32 %08x", n, c, got, want)
				}
				for _, c2 := range cuts {
					if c2 < c || c2 > n {
						continue
					}
					got := crc32c.Update(crc32c.Update(crc32c.Update(0, b[:c]), b[c:c2]), b[c2:])
					if got != want {
						t.Fatalf("%d bytes cut at %d and %d: %08x, hash/crc32 %08x", n, c, c2, got, want)
					}
				}
			}
		}
	})
}

// BenchmarkChecksum compares Checksum with hash/crc32 on 1 MiB units of a
// 1 GiB buffer (memory, not cache: a swap store's case) and on a buffer
// the caches hold; crc32c-nofold is Checksum without the folding kernel
// (hash/crc32 with the prefetching), where this CPU has the kernel. Run
// with -count and compare the medians: this machine's memory is shared.
func BenchmarkChecksum(b *testing.B) {
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
		if crc32c.CanFold() {
			b.Run(c.name+"/crc32c-nofold", func(b *testing.B) {
				defer crc32c.SetFold(crc32c.SetFold(false))
				run(b, crc32c.Checksum)
			})
		}
		b.Run(c.name+"/hash-crc32", func(b *testing.B) { run(b, func(p []byte) uint32 { return crc32.Checksum(p, tab) }) })
	}
}

// BenchmarkChecksumSizes compares Checksum with hash/crc32 on buffers of
// one size at a time, in the cache: where the kernel's fixed cost (its
// reduction to 32 bits, hash/crc32 on the tail) shows.
func BenchmarkChecksumSizes(b *testing.B) {
	buf := randomBytes(64<<10, 13)
	for _, n := range []int{64, 128, 256, 512, 1 << 10, 4 << 10, 16 << 10, 64 << 10} {
		p := buf[:n]
		b.Run(fmt.Sprintf("%d/crc32c", n), func(b *testing.B) {
			b.SetBytes(int64(n))
			for b.Loop() {
				crc32c.Checksum(p)
			}
		})
		b.Run(fmt.Sprintf("%d/hash-crc32", n), func(b *testing.B) {
			b.SetBytes(int64(n))
			for b.Loop() {
				crc32.Checksum(p, tab)
			}
		})
	}
}

// TestWhileComputing: with compute marked (package yield) a long buffer is
// summed in chunks with yield points between them: the same CRC.
func TestWhileComputing(t *testing.T) {
	yield.Begin()
	defer yield.End()
	r := rand.New(rand.NewPCG(7, 8))
	b := make([]byte, 5*yield.Chunk+333)
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	paths(t, func(t *testing.T) {
		for _, n := range []int{2 * yield.Chunk, 2*yield.Chunk + 1, 3*yield.Chunk - 5, 5*yield.Chunk + 333} {
			for _, off := range []int{0, 3} {
				if n+off > len(b) {
					continue
				}
				if got, want := crc32c.Checksum(b[off:off+n]), crc32.Checksum(b[off:off+n], tab); got != want {
					t.Fatalf("%d bytes at offset %d while computing: %08x, hash/crc32 %08x", n, off, got, want)
				}
			}
		}
	})
}

package swapper_test

import (
	"bytes"
	"context"
	"errors"
	"os"
	"testing"

	"github.com/zinfio/zinf/aio"
	"github.com/zinfio/zinf/buffers"
	"github.com/zinfio/zinf/swapper"
)

// TestChecksumBytes: with a checksum per 4 KiB (StoreOptions.ChecksumBytes)
// over a 64 KiB stripe on two paths, a ranged read of a few bytes
// transfers one or two units, not a stripe; whole, ranged and piecewise
// (PieceWriter) versions verify; a flipped byte is caught, by a ranged
// read of its unit, naming the tensor, its bytes and its file, and not by
// a ranged read of another unit.
func TestChecksumBytes(t *testing.T) {
	ctx := context.Background()
	e, err := aio.New(aio.Options{Backend: aio.BackendPosix, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	pool, err := buffers.NewPool(buffers.Options{CapacityBytes: 8 << 20, Pin: buffers.PinOff, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	s, err := swapper.OpenStore(swapper.StoreOptions{Paths: []string{t.TempDir(), t.TempDir()}, Engine: e, Checksums: true,
		StripeBytes: 64 << 10, ChecksumBytes: 5000, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if got := s.RangeUnit(); got > 8192 || (64<<10)%got != 0 {
		t.Fatalf("RangeUnit %d: want ChecksumBytes rounded to the alignment and dividing the stripe", got)
	}
	if n := s.RangeLen(100_000, 100_008); n > 2*s.RangeUnit() {
		t.Fatalf("RangeLen of 8 bytes is %d: more than two units of %d", n, s.RangeUnit())
	}
	const n = 300_001
	acq := func(size int) *buffers.Buffer {
		b, err := pool.Acquire(ctx, size, buffers.PurposeStaging)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(b.Release)
		return b
	}
	src := acq(int(s.PaddedLen(n)))
	for i := range n {
		src.Bytes()[i] = byte(i*7 + i>>11)
	}
	want := src.Bytes()[:n]
	if err := s.Write(ctx, "whole", want); err != nil {
		t.Fatal(err)
	}
	w, err := s.NewPieceWriter("pieces", n)
	if err != nil {
		t.Fatal(err)
	}
	for lo := 0; lo < n; lo += 128 << 10 {
		hi := min(lo+128<<10, n)
		b := acq(int(s.PaddedLen(int64(hi - lo))))
		copy(b.Bytes(), want[lo:hi])
		p, err := w.WriteAsync(b.Bytes()[:hi-lo])
		if err != nil {
			t.Fatal(err)
		}
		if err := p.Wait(); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Commit(); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"whole", "pieces"} {
		got := acq(int(s.PaddedLen(n)))
		if err := s.Read(ctx, name, got.Bytes()[:n]); err != nil || !bytes.Equal(got.Bytes()[:n], want) {
			t.Fatalf("%s: whole read: %v", name, err)
		}
		for _, r := range [][2]int64{{0, 1}, {100_000, 100_008}, {4095, 4097}, {n - 3, n}} {
			b := acq(int(s.RangeLen(r[0], r[1])))
			data, err := s.ReadRange(ctx, name, r[0], r[1], b.Bytes())
			if err != nil || !bytes.Equal(data, want[r[0]:r[1]]) {
				t.Fatalf("%s: range %v: %v", name, r, err)
			}
		}
	}
	path, off, err := s.Locate("pieces", 200_001)
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	one := []byte{0}
	f.ReadAt(one, off)
	one[0] ^= 0x10
	f.WriteAt(one, off)
	f.Close()
	b := acq(int(s.RangeLen(200_000, 200_004)))
	_, err = s.ReadRange(ctx, "pieces", 200_000, 200_004, b.Bytes())
	if !errors.Is(err, swapper.ErrChecksum) || !bytes.Contains([]byte(err.Error()), []byte(`"pieces"`)) || !bytes.Contains([]byte(err.Error()), []byte(path)) {
		t.Fatalf("the flipped byte's unit: %v", err)
	}
	b2 := acq(int(s.RangeLen(300_000, 300_001)))
	if _, err := s.ReadRange(ctx, "pieces", 300_000, 300_001, b2.Bytes()); err != nil {
		t.Fatalf("another unit: %v", err)
	}
}

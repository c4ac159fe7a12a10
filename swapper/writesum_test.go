package swapper_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/zinfio/zinf/aio"
	"github.com/zinfio/zinf/buffers"
	"github.com/zinfio/zinf/swapper"
)

// writeGate holds every write piece at the engine until opened: a write
// stays in flight for as long as a test needs.
type writeGate struct {
	open chan struct{}
	once sync.Once
}

func (g *writeGate) Before(p aio.PieceInfo) aio.Fault {
	if p.Op == aio.OpWrite {
		<-g.open
	}
	return aio.Fault{}
}

func (g *writeGate) release() { g.once.Do(func() { close(g.open) }) }

// TestWriteChecksumWhileInFlight: with checksums on, a write's CRC-32C is
// computed while its I/O is in flight, from the buffer just filled (still
// in the cache), not after the device finished; the sums are those of the
// bytes written, so the version reads back verified. Before, the checksum
// waited for the I/O: none was computed while the gate held the write.
func TestWriteChecksumWhileInFlight(t *testing.T) {
	g := &writeGate{open: make(chan struct{})}
	e, err := aio.New(aio.Options{BlockSizeBytes: 256 << 10, QueueDepth: 8, Faults: g, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	pool, err := buffers.NewPool(buffers.Options{CapacityBytes: 16 << 20, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pool.Close() })
	s, err := swapper.OpenStore(swapper.StoreOptions{Paths: []string{t.TempDir(), t.TempDir()}, Engine: e, Checksums: true, StripeBytes: 64 << 10, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	t.Cleanup(g.release) // first: nothing may stay held at the engine's close

	const n = 3<<20 + 5
	b, err := pool.Acquire(context.Background(), int(s.PaddedLen(n)), buffers.PurposeStaging)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Release()
	want := make([]byte, n)
	for i := range want {
		want[i] = byte(i*31 + i>>11)
	}
	copy(b.Bytes(), want)
	p, err := s.WriteAsync("w", b.Bytes()[:n])
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for s.Stats().ChecksumBytes < n {
		if time.Now().After(deadline) {
			summed := s.Stats().ChecksumBytes
			g.release()
			_ = p.Wait()
			t.Fatalf("no checksum while the write was in flight (%d of %d bytes summed after 10 s): the CRC waits for the device", summed, n)
		}
		time.Sleep(time.Millisecond)
	}
	g.release()
	if err := p.Wait(); err != nil {
		t.Fatal(err)
	}
	clear(b.Bytes())
	if err := s.Read(context.Background(), "w", b.Bytes()[:n]); err != nil {
		t.Fatalf("reading the version back (verified against the sums taken in flight): %v", err)
	}
	if !bytes.Equal(b.Bytes()[:n], want) {
		t.Fatal("read back other bytes than written")
	}
}

// TestLargeChecksumSplit: a version of many checksum units is
// checksummed on write and verified on read by several goroutines (one
// per 4 MiB, at most GOMAXPROCS): it reads back verified, whole and
// ranged; with two units corrupted, one in each goroutine's run, the
// read reports the first of them, as a check unit by unit in order would.
func TestLargeChecksumSplit(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(4))
	ctx := context.Background()
	e, err := aio.New(aio.Options{Backend: aio.BackendPosix, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	pool, err := buffers.NewPool(buffers.Options{CapacityBytes: 64 << 20, Pin: buffers.PinOff, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	s, err := swapper.OpenStore(swapper.StoreOptions{Paths: []string{t.TempDir(), t.TempDir()}, Engine: e, Checksums: true, StripeBytes: 64 << 10, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	const n = 17<<20 + 3
	acq := func() *buffers.Buffer {
		b, err := pool.Acquire(ctx, int(s.PaddedLen(n)), buffers.PurposeStaging)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(b.Release)
		return b
	}
	src, dst := acq(), acq()
	want := src.Bytes()[:n]
	for i := range want {
		want[i] = byte(i*7 + i>>13)
	}
	if err := s.Write(ctx, "big", want); err != nil {
		t.Fatal(err)
	}
	if err := s.Read(ctx, "big", dst.Bytes()[:n]); err != nil || !bytes.Equal(dst.Bytes()[:n], want) {
		t.Fatalf("whole read: %v (bytes equal: %v)", err, bytes.Equal(dst.Bytes()[:n], want))
	}
	lo, hi := int64(3<<20+11), int64(15<<20+5)
	rr, got, err := s.ReadRangeAsync("big", lo, hi, dst.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	if err := rr.Wait(); err != nil || !bytes.Equal(got, want[lo:hi]) {
		t.Fatalf("ranged read [%d, %d): %v", lo, hi, err)
	}
	// Corrupt a byte near the start of the last goroutine's run of units,
	// then one near the end of the first's: the early one is reported,
	// though the other goroutine finds its unit first (4 goroutines, 273
	// units of 64 KiB: runs of 69).
	flip := func(at int64) {
		path, off, err := s.Locate("big", at)
		if err != nil {
			t.Fatal(err)
		}
		f, err := os.OpenFile(path, os.O_RDWR, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		one := []byte{0}
		if _, err := f.ReadAt(one, off); err != nil {
			t.Fatal(err)
		}
		one[0] ^= 0x20
		if _, err := f.WriteAt(one, off); err != nil {
			t.Fatal(err)
		}
	}
	const unit = 64 << 10
	flip(208*unit + 100)
	flip(65*unit + 7)
	for range 5 {
		err = s.Read(ctx, "big", dst.Bytes()[:n])
		if !errors.Is(err, swapper.ErrChecksum) || !strings.Contains(err.Error(), fmt.Sprintf("bytes %d..%d", 65*unit, 66*unit)) {
			t.Fatalf("two corrupted units: want the first (bytes %d..%d) reported, got %v", 65*unit, 66*unit, err)
		}
	}
}

package swapper_test

import (
	"bytes"
	"context"
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

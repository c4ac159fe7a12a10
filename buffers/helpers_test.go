package buffers

import (
	"context"
	"io"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"
)

const testGranule = 4096

// recorder is a slog.Handler that keeps every record's level and message
// (with attributes), for asserting what the pool logged.
type recorder struct {
	mu      sync.Mutex
	records []slog.Record
}

func (r *recorder) Enabled(context.Context, slog.Level) bool { return true }
func (r *recorder) Handle(_ context.Context, rec slog.Record) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.records = append(r.records, rec.Clone())
	return nil
}
func (r *recorder) WithAttrs([]slog.Attr) slog.Handler { return r }
func (r *recorder) WithGroup(string) slog.Handler      { return r }

// at returns the texts (message plus attributes) logged at level.
func (r *recorder) at(level slog.Level) []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	for _, rec := range r.records {
		if rec.Level != level {
			continue
		}
		var sb strings.Builder
		sb.WriteString(rec.Message)
		rec.Attrs(func(a slog.Attr) bool {
			sb.WriteString(" " + a.String())
			return true
		})
		out = append(out, sb.String())
	}
	return out
}

func discardLogger() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// newTestPool makes an unpinned pool of granules x 4 KiB and closes it at
// the end of the test, failing the test on a leak.
func newTestPool(t testing.TB, granules int) *Pool {
	t.Helper()
	p, err := NewPool(Options{CapacityBytes: int64(granules) * testGranule, MinBufferBytes: testGranule, Pin: PinOff, Logger: discardLogger()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := p.Close(); err != nil && err != ErrClosed {
			t.Errorf("Close: %v", err)
		}
	})
	return p
}

func mustAcquire(t testing.TB, p *Pool, size int, purpose Purpose) *Buffer {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	b, err := p.Acquire(ctx, size, purpose)
	if err != nil {
		t.Fatalf("Acquire(%d, %s): %v", size, purpose, err)
	}
	return b
}

// acquireAsync starts an Acquire on its own goroutine.
func acquireAsync(ctx context.Context, p *Pool, size int, purpose Purpose) <-chan acquired {
	ch := make(chan acquired, 1)
	go func() {
		b, err := p.Acquire(ctx, size, purpose)
		ch <- acquired{b, err}
	}()
	return ch
}

type acquired struct {
	b   *Buffer
	err error
}

// waitFor polls cond until it holds or a few seconds pass.
func waitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

// waiting waits until n Acquire calls are queued on p.
func waiting(t testing.TB, p *Pool, n int) {
	t.Helper()
	waitFor(t, "queued waiters", func() bool { return p.Stats().Waiting == n })
}

func expectBlocked(t testing.TB, ch <-chan acquired) {
	t.Helper()
	select {
	case a := <-ch:
		t.Fatalf("Acquire should still be blocked, returned %v, %v", a.b, a.err)
	case <-time.After(20 * time.Millisecond):
	}
}

func receive(t testing.TB, ch <-chan acquired) acquired {
	t.Helper()
	select {
	case a := <-ch:
		return a
	case <-time.After(5 * time.Second):
		t.Fatal("Acquire did not return")
	}
	return acquired{}
}

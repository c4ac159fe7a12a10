package iobench

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/zinfio/zinf/aio"
)

// pieceLog records every piece the engine issues after the files are laid
// out (when on is set), and can fail writes from then on.
type pieceLog struct {
	mu       sync.Mutex
	on       bool
	seq      []aio.Op
	paths    map[aio.Op]map[string]bool
	maxOff   map[aio.Op]int64
	failFrom int // fail the n-th piece after on (0: never)
}

func (l *pieceLog) Before(p aio.PieceInfo) aio.Fault {
	l.mu.Lock()
	defer l.mu.Unlock()
	if p.Op == aio.OpRead && !l.on {
		l.on = true // the first read: layout is over, the mixed load begins
	}
	if !l.on {
		return aio.Fault{}
	}
	l.seq = append(l.seq, p.Op)
	if l.paths[p.Op] == nil {
		l.paths[p.Op] = map[string]bool{}
	}
	l.paths[p.Op][filepath.Base(p.Path)] = true
	l.maxOff[p.Op] = max(l.maxOff[p.Op], p.Offset+int64(p.Len))
	if l.failFrom > 0 && len(l.seq) >= l.failFrom && p.Op == aio.OpWrite {
		return aio.Fault{Err: syscall.EIO}
	}
	// Slow each piece a little so that both streams are seen in flight at
	// once even on a fast disk.
	return aio.Fault{Delay: 200 * time.Microsecond}
}

func newLog() *pieceLog {
	return &pieceLog{paths: map[aio.Op]map[string]bool{}, maxOff: map[aio.Op]int64{}}
}

func TestRunMixedReadsAndWritesAtOnce(t *testing.T) {
	dir := t.TempDir()
	log := newLog()
	const size = 4 << 20
	r, err := RunMixed(context.Background(), MixedOptions{Dir: dir, SizeBytes: size, ChunkBytes: 1 << 20,
		Duration: 300 * time.Millisecond, Engine: aio.Options{Backend: "posix", QueueDepth: 4, Faults: log}})
	if err != nil {
		t.Fatal(err)
	}
	if r.ReadGBps <= 0 || r.WriteGBps <= 0 || r.GBps != r.ReadGBps+r.WriteGBps || r.Seconds < 0.3 ||
		r.SizeBytes != size || r.ChunkBytes != 1<<20 || r.InFlight != 4 {
		t.Fatalf("result %+v: want both directions moving, GBps their sum, at least the duration", r)
	}
	// Each stream kept to its own file and inside it.
	if len(log.paths[aio.OpRead]) != 1 || !log.paths[aio.OpRead]["zinf-mixed-read.dat"] ||
		len(log.paths[aio.OpWrite]) != 1 || !log.paths[aio.OpWrite]["zinf-mixed-write.dat"] {
		t.Fatalf("files by op: %v", log.paths)
	}
	if log.maxOff[aio.OpRead] > size || log.maxOff[aio.OpWrite] > size {
		t.Fatalf("pieces beyond the %d-byte files: %v", size, log.maxOff)
	}
	// At once, not one after the other: the directions alternate many
	// times in the order the pieces were issued.
	switches := 0
	for i := 1; i < len(log.seq); i++ {
		if log.seq[i] != log.seq[i-1] {
			switches++
		}
	}
	if switches < 4 {
		t.Fatalf("reads and writes switched %d times in %d pieces: not a mixed load", switches, len(log.seq))
	}
	if names := listing(t, dir); len(names) != 0 {
		t.Fatalf("left behind: %v", names)
	}
}

func TestRunMixedWriteErrorEndsIt(t *testing.T) {
	dir := t.TempDir()
	log := newLog()
	log.failFrom = 6
	done := make(chan error, 1)
	go func() {
		_, err := RunMixed(context.Background(), MixedOptions{Dir: dir, SizeBytes: 4 << 20, ChunkBytes: 1 << 20,
			Duration: time.Minute, Engine: aio.Options{Backend: "posix", QueueDepth: 4, Faults: log}})
		done <- err
	}()
	select {
	case err := <-done:
		if !errors.Is(err, syscall.EIO) {
			t.Fatalf("err = %v, want the write's EIO", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("RunMixed did not stop at a write error within 20 s (its duration is a minute)")
	}
	if names := listing(t, dir); len(names) != 0 {
		t.Fatalf("left behind: %v", names)
	}
}

func TestRunMixedCancel(t *testing.T) {
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := RunMixed(ctx, MixedOptions{Dir: dir, SizeBytes: 2 << 20, ChunkBytes: 1 << 20,
		Duration: time.Minute, Engine: aio.Options{Backend: "posix"}})
	if !errors.Is(err, context.DeadlineExceeded) || time.Since(start) > 20*time.Second {
		t.Fatalf("err = %v after %v, want the deadline, soon", err, time.Since(start))
	}
}

func TestRunMixedLeavesOthersFiles(t *testing.T) {
	dir := t.TempDir()
	mine := filepath.Join(dir, "zinf-mixed-write.dat")
	if err := os.WriteFile(mine, []byte("not zinf's"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := RunMixed(context.Background(), MixedOptions{Dir: dir, SizeBytes: 1 << 20, Duration: time.Millisecond,
		Engine: aio.Options{Backend: "posix"}})
	if err == nil || !strings.Contains(err.Error(), "zinf-mixed-write.dat") {
		t.Fatalf("err = %v, want a refusal naming the file", err)
	}
	if b, err := os.ReadFile(mine); err != nil || string(b) != "not zinf's" {
		t.Fatalf("the file zinf did not create was changed: %q, %v", b, err)
	}
	if names := listing(t, dir); len(names) != 1 {
		t.Fatalf("dir holds %v, want only the user's file", names)
	}
}

func TestMixedOptionsCheck(t *testing.T) {
	o := MixedOptions{SizeBytes: 3 << 20, ChunkBytes: 2 << 20, InFlight: 65, Duration: -time.Second}
	err := o.Check()
	for _, want := range []string{"directory is required", "divide the size", "in flight 65", "must not be negative"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Check() = %v, want it to say %q", err, want)
		}
	}
}

func TestMixedChunkDefault(t *testing.T) {
	for _, c := range []struct {
		size, chunk int64
		inFlight    int
	}{
		{4 << 20, 4 << 20, 2}, {16 << 20, 16 << 20, 2}, {32 << 20, 16 << 20, 2}, {24 << 20, 1 << 20, 24},
		{64 << 20, 16 << 20, 2}, {40 << 20, 1 << 20, 32}, {8 << 30, 16 << 20, 2},
	} {
		o := MixedOptions{Dir: "d", SizeBytes: c.size}
		o.fill()
		if o.ChunkBytes != c.chunk || o.InFlight != c.inFlight || o.Check() != nil {
			t.Errorf("size %d: chunk %d, in flight %d (want %d, %d), Check %v", c.size, o.ChunkBytes, o.InFlight, c.chunk, c.inFlight, o.Check())
		}
	}
}

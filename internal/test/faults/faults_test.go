package faults

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/zinfio/zinf/aio"
)

func read(path string, off int64, n int) aio.PieceInfo {
	return aio.PieceInfo{Op: aio.OpRead, Path: path, Offset: off, Len: n, Align: 1}
}

func write(path string, off int64, n int) aio.PieceInfo {
	return aio.PieceInfo{Op: aio.OpWrite, Path: path, Offset: off, Len: n, Align: 1}
}

// fired lists the 1-based indexes of the pieces on which in returned a
// non-zero fault.
func fired(in *Injector, pieces []aio.PieceInfo) []int {
	var out []int
	for i, p := range pieces {
		if f := in.Before(p); f != (aio.Fault{}) {
			out = append(out, i+1)
		}
	}
	return out
}

func repeat(p aio.PieceInfo, n int) []aio.PieceInfo {
	out := make([]aio.PieceInfo, n)
	for i := range out {
		out[i] = p
		out[i].Offset = int64(i) * int64(p.Len)
	}
	return out
}

func TestNth(t *testing.T) {
	in := New(1, Rule{Nth: 3, Err: syscall.EIO})
	got := fired(in, repeat(write("/d/a", 0, 4096), 10))
	if fmt.Sprint(got) != "[3]" {
		t.Fatalf("Nth 3 fired on pieces %v, want [3]", got)
	}
	if in.Hits() != 1 {
		t.Fatalf("Hits = %d, want 1", in.Hits())
	}
	// The verdict carries the errno.
	in = New(1, Rule{Nth: 1, Err: syscall.ENOSPC})
	if f := in.Before(write("/d/a", 0, 4096)); f.Err != syscall.ENOSPC {
		t.Fatalf("fault = %+v, want ENOSPC", f)
	}
}

func TestByPath(t *testing.T) {
	// Only pieces of the matching path count towards Nth.
	in := New(1, Rule{PathContains: "zinf-optim-", Nth: 2, Err: syscall.EIO})
	pieces := []aio.PieceInfo{
		write("/nvme/zinf-param-0.swp", 0, 4096),
		write("/nvme/zinf-optim-0.swp", 0, 4096), // match 1
		read("/nvme/zinf-param-0.swp", 0, 4096),
		read("/nvme/zinf-grad-0.swp", 0, 4096),
		read("/nvme/zinf-optim-0.swp", 4096, 4096), // match 2: fires
		write("/nvme/zinf-optim-0.swp", 8192, 4096),
	}
	if got := fired(in, pieces); fmt.Sprint(got) != "[5]" {
		t.Fatalf("fired on %v, want [5]", got)
	}
	// An empty PathContains matches every path.
	in = New(1, Rule{Err: syscall.EIO})
	if got := fired(in, pieces); len(got) != len(pieces) {
		t.Fatalf("rule without a path fired on %v, want every piece", got)
	}
}

func TestByKind(t *testing.T) {
	pieces := []aio.PieceInfo{read("/f", 0, 512), write("/f", 0, 512), read("/f", 512, 512), write("/f", 512, 512)}
	for _, tc := range []struct {
		kind Kind
		want string
	}{
		{Reads, "[1 3]"},
		{Writes, "[2 4]"},
		{AnyOp, "[1 2 3 4]"},
	} {
		in := New(1, Rule{Kind: tc.kind, Err: syscall.EIO})
		if got := fmt.Sprint(fired(in, pieces)); got != tc.want {
			t.Errorf("kind %d fired on %s, want %s", tc.kind, got, tc.want)
		}
	}
	// Nth counts only pieces of the rule's kind.
	in := New(1, Rule{Kind: Writes, Nth: 2, Err: syscall.EIO})
	if got := fmt.Sprint(fired(in, pieces)); got != "[4]" {
		t.Errorf("second write: fired on %s, want [4]", got)
	}
}

func TestOffsetRange(t *testing.T) {
	in := New(1, Rule{MinOffset: 4096, MaxOffset: 12288, Err: syscall.EIO})
	got := fired(in, repeat(read("/f", 0, 4096), 4)) // offsets 0, 4096, 8192, 12288
	if fmt.Sprint(got) != "[2 3]" {
		t.Fatalf("offset range [4096, 12288) fired on pieces %v, want [2 3]", got)
	}
}

func decisions(seed uint64, n int) []bool {
	in := New(seed, Rule{Probability: 0.5, Err: syscall.EIO})
	out := make([]bool, n)
	for i := range out {
		out[i] = in.Before(read("/f", int64(i)*4096, 4096)).Err != 0
	}
	return out
}

func TestProbabilityIsSeeded(t *testing.T) {
	const n = 1000
	for _, seed := range []uint64{1, 42, 1 << 40} {
		a, b := decisions(seed, n), decisions(seed, n)
		yes := 0
		for i := range a {
			if a[i] != b[i] {
				t.Fatalf("seed %d: decision %d differs between two injectors with the same seed", seed, i)
			}
			if a[i] {
				yes++
			}
		}
		// A loose bound: p = 0.5 over 1000 pieces (anything outside is ~10 sigma away).
		if yes < 350 || yes > 650 {
			t.Errorf("seed %d: fired %d of %d times with probability 0.5", seed, yes, n)
		}
	}
	if fmt.Sprint(decisions(1, n)) == fmt.Sprint(decisions(2, n)) {
		t.Error("seeds 1 and 2 made the same 1000 decisions")
	}
	if got := New(77).Seed(); got != 77 {
		t.Errorf("Seed() = %d, want 77", got)
	}
	// Probability 1 always fires; a rule with neither Nth nor Probability
	// fires on every match.
	in := New(3, Rule{Probability: 1, Err: syscall.EIO})
	if got := fired(in, repeat(read("/f", 0, 512), 20)); len(got) != 20 {
		t.Errorf("probability 1 fired %d of 20 times", len(got))
	}
}

func TestTimes(t *testing.T) {
	in := New(1, Rule{Times: 2, Err: syscall.EIO})
	if got := fmt.Sprint(fired(in, repeat(write("/f", 0, 512), 6))); got != "[1 2]" {
		t.Fatalf("Times 2 fired on %s, want [1 2]", got)
	}
	in = New(9, Rule{Probability: 1, Times: 3, Err: syscall.EIO})
	if got := fired(in, repeat(write("/f", 0, 512), 10)); len(got) != 3 {
		t.Fatalf("Probability 1, Times 3 fired %d times, want 3", len(got))
	}
	if in.Hits() != 3 {
		t.Fatalf("Hits = %d, want 3", in.Hits())
	}
}

func TestShortKeepsAlignment(t *testing.T) {
	for _, tc := range []struct {
		name       string
		rule       Rule
		len, align int
		want       int
	}{
		{"shortlen rounded down", Rule{ShortLen: 5000}, 16384, 4096, 4096},
		{"shortlen at least one unit", Rule{ShortLen: 100}, 16384, 4096, 4096},
		{"shortlen exact", Rule{ShortLen: 8192}, 16384, 4096, 8192},
		{"shortlen unaligned file", Rule{ShortLen: 1000}, 16384, 1, 1000},
		{"shortlen align 0 means 1", Rule{ShortLen: 1000}, 16384, 0, 1000},
		{"shortlen not shorter", Rule{ShortLen: 16384}, 16384, 4096, 0},
		{"shortlen longer", Rule{ShortLen: 1 << 20}, 16384, 4096, 0},
		{"one unit cannot be short", Rule{ShortLen: 100}, 4096, 4096, 0},
		{"fraction half", Rule{Fraction: 0.5}, 16384, 4096, 8192},
		{"fraction rounded down", Rule{Fraction: 0.7}, 16384, 4096, 8192},
		{"fraction at least one unit", Rule{Fraction: 0.01}, 16384, 4096, 4096},
		{"fraction unaligned", Rule{Fraction: 0.25}, 1000, 1, 250},
		{"fraction 1 is not short", Rule{Fraction: 1}, 16384, 4096, 0},
		{"fraction above 1 ignored", Rule{Fraction: 2}, 16384, 4096, 0},
		{"fraction negative ignored", Rule{Fraction: -0.5}, 16384, 4096, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := New(1, tc.rule)
			f := in.Before(aio.PieceInfo{Op: aio.OpRead, Path: "/f", Len: tc.len, Align: tc.align})
			if f.ShortLen != tc.want {
				t.Fatalf("ShortLen = %d, want %d", f.ShortLen, tc.want)
			}
			if f.ShortLen != 0 {
				if a := max(tc.align, 1); f.ShortLen%a != 0 || f.ShortLen <= 0 || f.ShortLen >= tc.len {
					t.Fatalf("ShortLen %d is not a proper aligned prefix of %d (align %d)", f.ShortLen, tc.len, tc.align)
				}
			}
		})
	}
	// Two shortening rules: the shorter wins; errors: the first rule's.
	in := New(1, Rule{ShortLen: 8192}, Rule{Fraction: 0.25}, Rule{Err: syscall.EIO}, Rule{Err: syscall.ENOSPC})
	f := in.Before(aio.PieceInfo{Op: aio.OpWrite, Path: "/f", Len: 16384, Align: 4096})
	if f.ShortLen != 4096 || f.Err != syscall.EIO {
		t.Fatalf("combined fault = %+v, want ShortLen 4096 and EIO", f)
	}
	if in.Hits() != 4 {
		t.Fatalf("Hits = %d, want 4 (each rule that fired)", in.Hits())
	}
}

func TestDelayAccumulates(t *testing.T) {
	in := New(1, Rule{Delay: time.Millisecond}, Rule{Kind: Reads, Delay: 2 * time.Millisecond})
	if f := in.Before(read("/f", 0, 512)); f.Delay != 3*time.Millisecond || f.Err != 0 || f.ShortLen != 0 {
		t.Fatalf("read fault = %+v, want a 3ms delay only", f)
	}
	if f := in.Before(write("/f", 0, 512)); f.Delay != time.Millisecond {
		t.Fatalf("write fault = %+v, want a 1ms delay", f)
	}
}

func TestClearAndSetEnabled(t *testing.T) {
	in := New(1, Rule{Err: syscall.EIO})
	if in.Before(read("/f", 0, 512)).Err == 0 {
		t.Fatal("rule did not fire")
	}
	in.Clear()
	if f := in.Before(read("/f", 0, 512)); f != (aio.Fault{}) {
		t.Fatalf("after Clear: fault %+v, want none", f)
	}
	if in.Hits() != 1 {
		t.Fatalf("Clear changed Hits to %d, want 1", in.Hits())
	}
	in.Add(Rule{Err: syscall.ENOSPC})
	if in.Before(read("/f", 0, 512)).Err != syscall.ENOSPC {
		t.Fatal("rule added after Clear did not fire")
	}

	// Disabled, nothing fires and nothing is counted: Nth resumes where it
	// was when the injector is enabled again.
	in = New(1, Rule{Nth: 2, Err: syscall.EIO})
	if in.Before(read("/f", 0, 512)).Err != 0 {
		t.Fatal("first piece failed")
	}
	in.SetEnabled(false)
	for i := 0; i < 5; i++ {
		if f := in.Before(read("/f", 0, 512)); f != (aio.Fault{}) {
			t.Fatalf("disabled injector returned %+v", f)
		}
	}
	in.SetEnabled(true)
	if in.Before(read("/f", 0, 512)).Err != syscall.EIO {
		t.Fatal("after re-enabling, the second matching piece did not fail")
	}
	if s := in.String(); s != "faults.Injector{seed: 1, rules: 1, hits: 1}" {
		t.Errorf("String() = %q", s)
	}
}

// TestConcurrent runs Before from many goroutines while rules are added and
// the injector toggled (for -race), and checks that counted rules still fire
// exactly as often as they should.
func TestConcurrent(t *testing.T) {
	const workers, per = 8, 500
	in := New(7, Rule{Nth: 1234, Err: syscall.EIO}, Rule{Kind: Writes, Times: 10, Err: syscall.ENOSPC})
	var mu sync.Mutex
	var eio, enospc int
	var wg sync.WaitGroup
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var a, b int
			for i := 0; i < per; i++ {
				p := read("/f", int64(i)*512, 512)
				if i%2 == 1 {
					p.Op = aio.OpWrite
				}
				switch in.Before(p).Err {
				case syscall.EIO:
					a++
				case syscall.ENOSPC:
					b++
				}
			}
			mu.Lock()
			eio, enospc = eio+a, enospc+b
			mu.Unlock()
		}()
	}
	wg.Wait()
	// Every goroutine alternates reads and writes, so the first ten writes
	// come long before the 1234th piece: the two rules never share a piece.
	if eio != 1 || enospc != 10 {
		t.Fatalf("EIO %d times (want 1), ENOSPC %d times (want 10)", eio, enospc)
	}
	if in.Hits() != 11 {
		t.Fatalf("Hits = %d, want 11", in.Hits())
	}

	// Mutations racing with Before.
	in = New(8)
	var wg2 sync.WaitGroup
	stop := make(chan struct{})
	for w := 0; w < 4; w++ {
		wg2.Add(1)
		go func() {
			defer wg2.Done()
			for {
				select {
				case <-stop:
					return
				default:
					in.Before(write("/f", 0, 4096))
				}
			}
		}()
	}
	for i := 0; i < 200; i++ {
		in.Add(Rule{Probability: 0.1, Err: syscall.EIO})
		in.SetEnabled(i%2 == 0)
		_ = in.Hits()
		_ = in.String()
		if i%50 == 0 {
			in.Clear()
		}
	}
	close(stop)
	wg2.Wait()
}

// TestThroughEngine puts an Injector into a real engine: a short transfer
// is completed by the engine (the data arrives whole), an ENOSPC surfaces
// as aio.ErrNoSpace with the path, and both show up in Hits.
func TestThroughEngine(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "data.bin")
	in := New(11)
	e, err := aio.New(aio.Options{Backend: aio.BackendPosix, BlockSizeBytes: 64 << 10, QueueDepth: 4,
		Direct: aio.DirectOff, Faults: in, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	f, err := e.Open(path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	ctx := context.Background()
	data := make([]byte, 256<<10)
	for i := range data {
		data[i] = byte(i * 7)
	}

	in.Add(Rule{Kind: Writes, Fraction: 0.5})
	if n, err := e.WriteAt(ctx, f, data, 0); err != nil || n != len(data) {
		t.Fatalf("write with short transfers: n=%d err=%v (%v)", n, err, in)
	}
	in.Clear()
	in.Add(Rule{Kind: Reads, ShortLen: 1000})
	got := make([]byte, len(data))
	if n, err := e.ReadAt(ctx, f, got, 0); err != nil || n != len(data) {
		t.Fatalf("read with short transfers: n=%d err=%v (%v)", n, err, in)
	}
	if !bytes.Equal(got, data) {
		t.Fatal("data read back differs from data written through short transfers")
	}
	shortHits := in.Hits()
	if shortHits == 0 {
		t.Fatal("no short transfer was injected")
	}

	in.Clear()
	in.Add(Rule{Kind: Writes, PathContains: "data.bin", Nth: 2, Err: syscall.ENOSPC})
	_, err = e.WriteAt(ctx, f, data, 0)
	if !errors.Is(err, aio.ErrNoSpace) || !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("write with an injected ENOSPC: err = %v, want aio.ErrNoSpace (%v)", err, in)
	}
	var oe *aio.OpError
	if !errors.As(err, &oe) || oe.Path != path {
		t.Fatalf("error %v does not name the path %s", err, path)
	}
	if in.Hits() != shortHits+1 {
		t.Fatalf("Hits = %d, want %d", in.Hits(), shortHits+1)
	}
}

package gccredit

import (
	"math"
	"runtime/debug"
	"strings"
	"testing"
)

// gogc reads GOGC (SetGCPercent only reads by setting).
func gogc() int {
	p := debug.SetGCPercent(100)
	debug.SetGCPercent(p)
	return p
}

// TestTakeRelease: a credit raises GOGC above what it was, the last
// release restores it, and under a Go memory limit nothing is taken.
func TestTakeRelease(t *testing.T) {
	if limit := debug.SetMemoryLimit(-1); limit != math.MaxInt64 {
		t.Skipf("GOMEMLIMIT is set (%d bytes)", limit)
	}
	base := gogc()
	if base < 0 {
		t.Skip("GOGC=off")
	}
	n, status := Take(1 << 30)
	if n != 1<<30 || !strings.Contains(status, "bytes") {
		t.Fatalf("Take(1 GiB) = %d, %q", n, status)
	}
	if got := gogc(); got <= base {
		t.Fatalf("GOGC %d with a 1 GiB credit, %d without: want more", got, base)
	}
	m, _ := Take(1 << 20)
	Release(n)
	if got := gogc(); got == base {
		t.Fatalf("GOGC back to %d while a credit of %d bytes is still held", got, m)
	}
	Release(m)
	if got := gogc(); got != base {
		t.Fatalf("GOGC %d after the last release: want %d", got, base)
	}

	old := debug.SetMemoryLimit(1 << 40)
	defer debug.SetMemoryLimit(old)
	if n, status := Take(1 << 20); n != 0 || !strings.Contains(status, "memory limit") {
		t.Fatalf("Take under a memory limit = %d, %q: want none, saying why", n, status)
	}
	if got := gogc(); got != base {
		t.Fatalf("GOGC %d after a refused Take: want %d", got, base)
	}
}

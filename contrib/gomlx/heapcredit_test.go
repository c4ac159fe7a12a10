package zgomlx_test

import (
	"math"
	"runtime"
	"runtime/debug"
	"strings"
	"testing"
	"time"

	"github.com/gomlx/compute/dtypes"
	"github.com/gomlx/compute/shapes"

	zgomlx "github.com/zinfio/zinf/contrib/gomlx"
)

// TestHeapCredit: Options.HeapCredit holds the bytes asked for (or the
// in-memory state, with AutoHeapCredit), the garbage collector paces by it (no
// cycle over steps that collect without it) and GOGC is as it was once
// the Offload closes; nothing is taken while a memory limit is set, and a
// bad value is refused naming the option.
func TestHeapCredit(t *testing.T) {
	ctx := watchdog(t, 3*time.Minute)
	net := mlpNet(48, 40, 8)
	b := backend(t)
	x := shapes.Make(dtypes.Float32, 16, 24)
	if old := debug.SetMemoryLimit(math.MaxInt64); old != math.MaxInt64 {
		t.Cleanup(func() { debug.SetMemoryLimit(old) })
	}
	// GOGC=10: a collection whenever the heap grows by a tenth of what is
	// live, so a few steps collect without a credit on any heap.
	defer debug.SetGCPercent(debug.SetGCPercent(10))
	open := func(credit int64) (*zgomlx.Trainer, error) {
		store := newStore(t, b, net, x, 3)
		return zgomlx.Create(ctx, b, testConfig(t, 8<<20), store, net, zgomlx.Options{HeapCredit: credit})
	}
	gcsOver := func(tr *zgomlx.Trainer, steps int) uint32 {
		var m0, m1 runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&m0)
		for i := range steps {
			xb, yb := mlpBatch(i, 16, 24, 8)
			if _, err := tr.Step(ctx, xb, yb); err != nil {
				t.Fatal(err)
			}
		}
		runtime.ReadMemStats(&m1)
		return m1.NumGC - m0.NumGC
	}

	if _, err := open(-3); err == nil || !strings.Contains(err.Error(), "Options.HeapCredit -3") || !strings.Contains(err.Error(), "NoHeapCredit") {
		t.Fatalf("HeapCredit -3: %v, want an error naming the option, the value and what is allowed", err)
	}

	tr, err := open(zgomlx.NoHeapCredit)
	if err != nil {
		t.Fatal(err)
	}
	if n, why := tr.Offload().HeapCredit(); n != 0 || !strings.Contains(why, "none") {
		t.Fatalf("no credit asked: HeapCredit() = %d, %q", n, why)
	}
	without := gcsOver(tr, 12)
	tr.Close()
	if without == 0 {
		t.Fatal("12 steps ran no collection without a credit at GOGC=10")
	}

	const credit = 1 << 30
	tr, err = open(credit)
	if err != nil {
		t.Fatal(err)
	}
	n, why := tr.Offload().HeapCredit()
	if n != credit {
		t.Fatalf("HeapCredit() = %d, %q; want %d held", n, why, credit)
	}
	if g := gogc(); g <= 10 {
		t.Fatalf("GOGC %d with a credit of 1 GiB on a heap of a few MiB: want it scaled up from 10", g)
	}
	with := gcsOver(tr, 12)
	tr.Close()
	if g := gogc(); g != 10 {
		t.Fatalf("GOGC %d after the Offload with the credit closed, want 10 again", g)
	}
	t.Logf("collections over 12 steps: %d without a credit, %d with %d bytes", without, with, credit)
	if with != 0 {
		t.Fatalf("a credit of 1 GiB: %d collections over 12 steps (%d without); want none", with, without)
	}

	// The default (0) is AutoHeapCredit.
	tr, err = open(0)
	if err != nil {
		t.Fatal(err)
	}
	var elems int64
	for _, v := range tr.Offload().Vars() {
		elems += int64(v.Shape.Size())
	}
	// fp32 parameters (zinf's default param dtype) are Adam's masters: in
	// memory, 4 bytes of each, and 4 of each moment.
	if n, why := tr.Offload().HeapCredit(); n != 12*elems || n != tr.Offload().InMemoryBytes() {
		t.Fatalf("AutoHeapCredit: HeapCredit() = %d, %q; want what training in memory holds, 12 x %d elements", n, why, elems)
	}
	tr.Close()

	debug.SetMemoryLimit(256 << 20)
	tr, err = open(credit)
	debug.SetMemoryLimit(math.MaxInt64)
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	if n, why := tr.Offload().HeapCredit(); n != 0 || !strings.Contains(why, "memory limit") {
		t.Fatalf("with a memory limit: HeapCredit() = %d, %q; want none, saying why", n, why)
	}
}

// gogc reads GOGC.
func gogc() int {
	g := debug.SetGCPercent(100)
	debug.SetGCPercent(g)
	return g
}

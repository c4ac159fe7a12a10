package swapper_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/zinfio/zinf/swapper"
)

// mapCtx is a context type that cannot be compared (it holds a map).
type mapCtx struct {
	context.Context
	m map[string]int
}

func done(ctx context.Context) bool {
	select {
	case <-ctx.Done():
		return true
	case <-time.After(time.Second):
		return false
	}
}

// TestOpContexts: an operation's context ends with the caller's and with
// the base (the swapper's Close); repeated operations under one caller
// context allocate nothing; onEnd runs once per operation.
func TestOpContexts(t *testing.T) {
	base, closeBase := context.WithCancel(context.Background())
	ends := 0
	var mu sync.Mutex
	o := swapper.NewOpContexts(base, func() { mu.Lock(); ends++; mu.Unlock() })

	if ctx, end := o.Get(context.Background()); ctx != base {
		t.Fatal("an operation under a never-done context does not run under the base")
	} else {
		end()
	}

	caller, cancelCaller := context.WithCancel(context.Background())
	ctx1, end1 := o.Get(caller)
	ctx2, end2 := o.Get(caller) // shares the derivation
	if ctx1 != ctx2 {
		t.Fatal("two operations under one caller context got two derivations")
	}
	end1()
	end2()
	if n := testing.AllocsPerRun(100, func() {
		_, end := o.Get(caller)
		end()
	}); n != 0 {
		t.Fatalf("%v allocations per operation under a reused caller context", n)
	}
	ctx3, end3 := o.Get(caller)
	cancelCaller()
	if !done(ctx3) {
		t.Fatal("the operation's context did not end with the caller's")
	}
	end3()
	// A done cached derivation is not handed out again.
	caller2, cancel2 := context.WithCancel(context.Background())
	defer cancel2()
	ctx4, end4 := o.Get(caller2)
	if ctx4.Err() != nil {
		t.Fatal("a fresh caller context got a done derivation")
	}
	// Another caller context while the cached one is in use: its own.
	caller3, cancel3 := context.WithTimeout(context.Background(), time.Hour)
	defer cancel3()
	ctx5, end5 := o.Get(caller3)
	if ctx5 == ctx4 {
		t.Fatal("two caller contexts share a derivation")
	}
	nc := mapCtx{Context: caller2, m: map[string]int{}}
	ctx6, end6 := o.Get(nc) // not comparable: derived each time, no panic
	closeBase()
	for i, c := range []context.Context{ctx4, ctx5, ctx6} {
		if !done(c) {
			t.Fatalf("operation %d's context did not end with the base", i)
		}
	}
	end4()
	end5()
	end6()
	o.Close()
	mu.Lock()
	defer mu.Unlock()
	if want := 1 + 2 + 101 + 1 + 3; ends != want { // AllocsPerRun runs once more to warm up
		t.Fatalf("onEnd ran %d times for %d operations", ends, want)
	}
}

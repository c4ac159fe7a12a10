package yield_test

import (
	"bytes"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/zinfio/zinf/internal/base/yield"
)

// attempts runs Point tries times with GOMAXPROCS 1, each time just after
// making a goroutine runnable (it waits for the only processor), and
// returns, over the tries in which that goroutine had not run before Point
// (a collection can let it run first), how many let it run inside Point
// and how many paused.
func attempts(t *testing.T, tries int) (valid, ranInside, paused int) {
	t.Helper()
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	for range tries {
		var ran atomic.Bool
		done := make(chan struct{})
		go func() {
			ran.Store(true)
			close(done)
		}()
		before, p0 := ran.Load(), yield.Pauses()
		yield.Point()
		if !before {
			valid++
			if ran.Load() {
				ranInside++
			}
			if yield.Pauses() > p0 {
				paused++
			}
		}
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Fatal("the waiting goroutine never ran")
		}
	}
	return valid, ranInside, paused
}

func TestPointGivesWayWhileComputing(t *testing.T) {
	yield.Begin()
	defer yield.End()
	valid, ran, paused := attempts(t, 50)
	if valid < 25 {
		t.Fatalf("only %d of 50 tries found the goroutine waiting", valid)
	}
	// Nearly every Point that found a goroutine waiting paused and let it
	// run (a collection's workers can take a pause, or let it run first).
	if ran < valid*9/10 || paused < valid*9/10 {
		t.Fatalf("of %d Points with compute marked and a goroutine waiting, %d paused and %d let it run (want 90%%)", valid, paused, ran)
	}
}

func TestPointWithoutComputeGoesOn(t *testing.T) {
	if yield.Active() {
		t.Fatal("compute marked before Begin")
	}
	valid, ran, paused := attempts(t, 50)
	if paused != 0 {
		t.Fatalf("Point with no compute marked paused %d times", paused)
	}
	if valid < 25 || ran > valid/2 {
		t.Fatalf("of %d Points with no compute marked, %d let a waiting goroutine run first", valid, ran)
	}
}

func TestBeginNests(t *testing.T) {
	yield.Begin()
	yield.Begin()
	yield.End()
	if !yield.Active() {
		t.Fatal("one End of two Begins ended the compute")
	}
	yield.End()
	if yield.Active() {
		t.Fatal("compute still marked after every End")
	}
	defer func() {
		if recover() == nil {
			t.Fatal("End without Begin did not panic")
		}
		yield.Begin() // restore the count the failed End took
	}()
	yield.End()
}

func BenchmarkPoint(b *testing.B) {
	b.Run("idle", func(b *testing.B) {
		for b.Loop() {
			yield.Point()
		}
	})
	b.Run("computing", func(b *testing.B) {
		yield.Begin()
		defer yield.End()
		for b.Loop() {
			yield.Point()
		}
	})
}

func TestCopy(t *testing.T) {
	src := make([]byte, 5*yield.Chunk+13)
	for i := range src {
		src[i] = byte(i * 7)
	}
	for _, computing := range []bool{false, true} {
		if computing {
			yield.Begin()
		}
		for _, n := range []int{0, 1, 2 * yield.Chunk, 2*yield.Chunk + 1, len(src)} {
			dst := make([]byte, n+3)
			if got := yield.Copy(dst, src[:n]); got != n {
				t.Fatalf("computing %v: Copy of %d bytes returned %d", computing, n, got)
			}
			if !bytes.Equal(dst[:n], src[:n]) || !bytes.Equal(dst[n:], []byte{0, 0, 0}) {
				t.Fatalf("computing %v: Copy of %d bytes copied something else", computing, n)
			}
		}
		if computing {
			yield.End()
		}
	}
}

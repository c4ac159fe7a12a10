package buffers

import (
	"context"
	"errors"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/zinfio/zinf/internal/test/testenv"
)

// liveSet records the address ranges of live buffers and fails on overlap.
type liveSet struct {
	mu     sync.Mutex
	ranges map[uintptr]uintptr // start -> end
}

func (s *liveSet) add(t *testing.T, b *Buffer) {
	full := b.Full()
	start := uintptr(unsafe.Pointer(unsafe.SliceData(full)))
	end := start + uintptr(len(full))
	s.mu.Lock()
	defer s.mu.Unlock()
	for st, en := range s.ranges {
		if start < en && st < end {
			t.Errorf("live buffers overlap: [%#x,%#x) and [%#x,%#x)", start, end, st, en)
		}
	}
	s.ranges[start] = end
}

func (s *liveSet) remove(b *Buffer) {
	s.mu.Lock()
	delete(s.ranges, uintptr(unsafe.Pointer(unsafe.SliceData(b.Full()))))
	s.mu.Unlock()
}

func fill(b []byte, seed byte) {
	for i := range b {
		b[i] = seed + byte(i*7)
	}
}

func intact(b []byte, seed byte) bool {
	for i := range b {
		if b[i] != seed+byte(i*7) {
			return false
		}
	}
	return true
}

// TestConcurrentStress has goroutines acquire random sizes and purposes
// (some with short deadlines, some with TryAcquire, now and then the whole
// arena), write a pattern over the full class, sometimes hand the buffer to
// another goroutine with Retain, and check that no two live buffers overlap,
// that contents survive until release, and that the books balance at the end.
func TestConcurrentStress(t *testing.T) {
	const (
		granules   = 256 // 1 MiB
		goroutines = 8
	)
	iters := testenv.Scale(300, 3000)
	if testing.Short() {
		iters = 100
	}
	p := newTestPool(t, granules)
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	live := &liveSet{ranges: map[uintptr]uintptr{}}
	var wg, handoffs sync.WaitGroup
	var timeouts atomic.Int64
	for g := range goroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(seed, uint64(g)))
			for i := range iters {
				size := 1 + r.IntN(24*testGranule)
				switch r.IntN(60) {
				case 0:
					size = granules * testGranule // the whole arena: FIFO must get it through
				case 1, 2, 3, 4, 5, 6:
					size = 1 + r.IntN(testGranule)
				}
				purpose := Purpose(r.IntN(int(NumPurposes)))
				var b *Buffer
				if r.IntN(6) == 0 {
					var ok bool
					if b, ok = p.TryAcquire(size, purpose); !ok {
						continue
					}
				} else {
					timeout := 10 * time.Second
					if r.IntN(8) == 0 {
						timeout = time.Duration(r.IntN(200)) * time.Microsecond
					}
					ctx, cancel := context.WithTimeout(context.Background(), timeout)
					var err error
					b, err = p.Acquire(ctx, size, purpose)
					cancel()
					if errors.Is(err, context.DeadlineExceeded) {
						timeouts.Add(1)
						continue
					}
					if err != nil {
						t.Errorf("Acquire(%d): %v", size, err)
						return
					}
				}
				if b.Len() != size || b.Cap()%testGranule != 0 || b.Cap()-b.Len() >= testGranule || b.Purpose() != purpose {
					t.Errorf("buffer len %d cap %d purpose %v for %d %v", b.Len(), b.Cap(), b.Purpose(), size, purpose)
				}
				live.add(t, b)
				pat := byte(g*37 + i)
				fill(b.Full(), pat)
				if r.IntN(3) == 0 {
					// Hand off to a "reader" that outlives our reference.
					var owners atomic.Int32
					owners.Store(2)
					b.Retain()
					handoffs.Add(1)
					go func() {
						defer handoffs.Done()
						time.Sleep(time.Duration(r2(seed, g, i)) * time.Microsecond)
						if !intact(b.Full(), pat) {
							t.Errorf("buffer contents changed under a reader")
						}
						if owners.Add(-1) == 0 {
							live.remove(b)
						}
						b.Release()
					}()
					if owners.Add(-1) == 0 {
						live.remove(b)
					}
					b.Release()
					continue
				}
				if r.IntN(2) == 0 {
					time.Sleep(time.Duration(r.IntN(50)) * time.Microsecond)
				}
				if !intact(b.Full(), pat) {
					t.Errorf("buffer contents changed while held")
				}
				live.remove(b)
				b.Release()
			}
		}()
	}
	wg.Wait()
	handoffs.Wait()
	s := p.Stats()
	t.Logf("acquires %d, waits %d, timeouts %d, peak %d of %d bytes", s.Acquires, s.Waits, timeouts.Load(), s.PeakInUseBytes, s.CapacityBytes)
	if s.Outstanding != 0 || s.InUseBytes != 0 || s.Waiting != 0 || s.Misuses != 0 || s.RequestedBytes != 0 {
		t.Fatalf("books do not balance: %+v", s)
	}
	for _, v := range s.InUseBytesByPurpose {
		if v != 0 {
			t.Fatalf("per-purpose books do not balance: %+v", s)
		}
	}
	p.mu.Lock()
	err := p.regions[0].alloc.checkInvariants()
	p.mu.Unlock()
	if err != nil {
		t.Fatal(err)
	}
	mustAcquire(t, p, granules*testGranule, PurposeParams).Release()
}

// r2 is a small deterministic delay for the reader goroutines (they cannot
// share the caller's rand.Rand).
func r2(seed uint64, g, i int) int { return int((seed + uint64(g*131+i*7)) % 40) }

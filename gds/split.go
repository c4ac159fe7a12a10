package gds

import (
	"context"
	"sync"
	"sync/atomic"
)

// piece is one part of a request: [start, start+len) in the file.
type piece struct {
	start, len int64
}

// split hands out a request's pieces to the goroutines working on it and
// collects the bytes they move and the first error. Pieces are the
// request's intersections with the windows [k*block, (k+1)*block) of the
// file, so every piece but the first and last starts and ends at a
// multiple of block: aligned for O_DIRECT whenever the request's ends are,
// and never sharing an alignment block with another piece.
type split struct {
	ctx          context.Context
	off, n       int64
	block        int64
	first, count int64 // first window index, number of pieces

	next   atomic.Int64 // next piece to claim
	done   atomic.Int64 // bytes moved
	failed atomic.Bool

	mu  sync.Mutex
	err error // the first failure
}

func newSplit(ctx context.Context, off, n, block int64) *split {
	s := &split{ctx: ctx, off: off, n: n, block: block}
	if n > 0 {
		s.first = off / block
		s.count = (off+n-1)/block - s.first + 1
	}
	return s
}

// claim returns the next piece, or false when none remain, a piece failed
// or the context is done (which counts as a failure).
func (s *split) claim() (piece, bool) {
	if s.failed.Load() {
		return piece{}, false
	}
	if err := s.ctx.Err(); err != nil {
		s.fail(err)
		return piece{}, false
	}
	i := s.next.Add(1) - 1
	if i >= s.count {
		return piece{}, false
	}
	w := s.first + i
	start := max(s.off, w*s.block)
	end := min(s.off+s.n, (w+1)*s.block)
	return piece{start: start, len: end - start}, true
}

// fail records err if it is the first failure and stops further claims.
func (s *split) fail(err error) {
	s.mu.Lock()
	if s.err == nil {
		s.err = err
	}
	s.mu.Unlock()
	s.failed.Store(true)
}

// run calls work on min(parallelism, pieces) goroutines, the caller's
// included, and waits for them.
func (s *split) run(parallelism int, work func()) {
	workers := int(min(int64(parallelism), s.count))
	if workers <= 0 {
		return
	}
	var wg sync.WaitGroup
	for range workers - 1 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			work()
		}()
	}
	work()
	wg.Wait()
}

// result returns the bytes moved and the first failure.
func (s *split) result() (int64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.done.Load(), s.err
}

package gds

import (
	"sync"
	"sync/atomic"

	"github.com/zinfio/zinf/aio"
)

// lifecycle is what the cuFile engine and the bounce path share to stay
// usable until Close: every request holds life shared, Close takes it
// exclusively, so Close waits for requests in flight and later ones fail.
type lifecycle struct {
	life   sync.RWMutex
	mu     sync.Mutex // guards closed and the owner's fields it documents
	closed bool
}

// enter admits a request, or returns aio.ErrClosed.
func (l *lifecycle) enter() error {
	l.life.RLock()
	l.mu.Lock()
	closed := l.closed
	l.mu.Unlock()
	if closed {
		l.life.RUnlock()
		return aio.ErrClosed
	}
	return nil
}

// exit ends a request admitted by enter.
func (l *lifecycle) exit() { l.life.RUnlock() }

// counters are a DeviceIO's cumulative statistics.
type counters struct {
	readOps, writeOps, readBytes, writeBytes atomic.Int64
	pieces, retries, shorts, errs            atomic.Int64
}

// Stats returns the counters as aio.Stats (Pieces counts the pieces
// issued, staged pieces on the bounce path).
func (c *counters) Stats() aio.Stats {
	return aio.Stats{
		ReadOps: c.readOps.Load(), WriteOps: c.writeOps.Load(),
		ReadBytes: c.readBytes.Load(), WriteBytes: c.writeBytes.Load(),
		Pieces: c.pieces.Load(), Retries: c.retries.Load(),
		ShortTransfers: c.shorts.Load(), Errors: c.errs.Load(),
	}
}

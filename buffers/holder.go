package buffers

import (
	"context"
	"fmt"
	"slices"
	"strings"
)

// Holder names who holds a pool's buffers, so that the pool can tell a
// wait that can never be served from one that is merely slow. An Acquire
// whose context carries a Holder (WithHolder) records the buffer as the
// holder's until its last Release, and the wait, if it blocks, as the
// holder's. When every buffer of the region a holder waits on is held by
// holders that are waiting themselves — nothing can ever be released —
// their waits fail at once with a *DeadlockError naming each holder, what
// it holds and what it waits for, instead of after Options.StallTimeout.
//
// A holder stands for one goroutine (or a group of goroutines that, like
// one, releases nothing while any of them waits in Acquire): the check
// relies on a waiting holder releasing none of its buffers until its wait
// returns. A buffer handed to someone else who releases it (an in-flight
// I/O that calls Release) is acquired without a holder, or under the
// holder of who releases it; Retain does not change the holder (the
// memory returns at the last Release, which the waiting holder's own
// reference blocks). Buffers acquired without a holder are never taken
// for stuck: a region holding any of them is not checked, as before.
type Holder struct {
	name string
}

// NewHolder returns a holder named name (a goroutine's role, "optimizer
// worker 2", say), for WithHolder. Two holders are distinct even with
// equal names.
func NewHolder(name string) *Holder { return &Holder{name: name} }

// Name returns the name given to NewHolder.
func (h *Holder) Name() string { return h.name }

type holderKey struct{}

// WithHolder returns a context whose Acquire calls hold buffers for h
// (see Holder). A nil h returns ctx unchanged.
func WithHolder(ctx context.Context, h *Holder) context.Context {
	if h == nil {
		return ctx
	}
	return context.WithValue(ctx, holderKey{}, h)
}

// HolderFrom returns the Holder WithHolder put in ctx, or nil.
func HolderFrom(ctx context.Context) *Holder {
	h, _ := ctx.Value(holderKey{}).(*Holder)
	return h
}

// holdState is a pool's accounting of one holder: buffers held per region
// and Acquire calls waiting. It lives while either is nonzero.
type holdState struct {
	h       *Holder
	held    []int64 // outstanding buffers, by region index
	bytes   []int64 // their size-class bytes, by region index
	waiting int
	stuck   bool // scratch of deadlockLocked
}

func (s *holdState) idle() bool {
	if s.waiting > 0 {
		return false
	}
	for _, n := range s.held {
		if n > 0 {
			return false
		}
	}
	return true
}

// holdLocked returns h's state in p, creating it.
func (p *Pool) holdLocked(h *Holder) *holdState {
	if s := p.holders[h]; s != nil {
		return s
	}
	if p.holders == nil {
		p.holders = make(map[*Holder]*holdState)
	}
	s := &holdState{h: h, held: make([]int64, len(p.regions)), bytes: make([]int64, len(p.regions))}
	p.holders[h] = s
	return s
}

// dropIdleLocked forgets s once it holds nothing and waits for nothing.
func (p *Pool) dropIdleLocked(s *holdState) {
	if s.idle() {
		delete(p.holders, s.h)
	}
}

// checkDeadlockLocked finds the holders whose waits can never be served
// and fails every one of their waiting Acquire calls with a
// *DeadlockError. A holder is stuck when, in each region it waits on,
// every outstanding buffer is held by stuck holders (none by a buffer
// without a holder, none by a holder that is not waiting): the greatest
// set with that property is computed by striking out, until nothing
// changes, every waiting holder for which it fails.
func (p *Pool) checkDeadlockLocked() {
	if p.holderWaits == 0 || p.closed {
		return
	}
	var cands []*holdState
	for _, s := range p.holders {
		s.stuck = s.waiting > 0
		if s.stuck {
			cands = append(cands, s)
		}
	}
	for changed := true; changed; {
		changed = false
		for _, r := range p.regions {
			if r.waitHead == nil {
				continue
			}
			free := r.anon > 0 // a buffer no holder vouches for may come back
			if !free {
				for _, s := range p.holders {
					if s.held[r.index] > 0 && !s.stuck {
						free = true
						break
					}
				}
			}
			if !free && r.alloc.canAlloc(r.waitHead.units) {
				free = true // served by the next grant (or the head's cancellation)
			}
			if !free {
				continue
			}
			for w := r.waitHead; w != nil; w = w.next {
				if w.hold != nil && w.hold.stuck {
					w.hold.stuck, changed = false, true
				}
			}
		}
	}
	var stuck []*holdState
	for _, s := range cands {
		if s.stuck {
			stuck = append(stuck, s)
		}
	}
	if len(stuck) == 0 {
		return
	}
	err := &DeadlockError{Holders: p.describeStuckLocked(stuck), Held: p.holdersLocked()}
	for _, r := range p.regions {
		for w := r.waitHead; w != nil; {
			next := w.next
			if w.hold != nil && w.hold.stuck {
				p.dequeueLocked(r, w)
				w.err = err
				p.deadlocks++
				w.ready <- struct{}{}
			}
			w = next
		}
	}
	for _, s := range stuck {
		s.stuck = false
	}
	// Those queued behind a failed waiter may fit now.
	for _, r := range p.regions {
		if r.alloc != nil {
			p.grantLocked(r)
		}
	}
}

// describeStuckLocked says, for each stuck holder, what it holds and what
// it waits for, in name order.
func (p *Pool) describeStuckLocked(stuck []*holdState) string {
	slices.SortFunc(stuck, func(a, b *holdState) int { return strings.Compare(a.h.name, b.h.name) })
	parts := make([]string, 0, len(stuck))
	for _, s := range stuck {
		var held, waits []string
		for i, r := range p.regions {
			if s.held[i] > 0 {
				held = append(held, fmt.Sprintf("%s in %d buffer(s) of the %s region", formatBytes(s.bytes[i]), s.held[i], r.name))
			}
			for w := r.waitHead; w != nil; w = w.next {
				if w.hold == s {
					waits = append(waits, fmt.Sprintf("%s for %s", formatBytes(int64(w.size)), w.purpose))
				}
			}
		}
		if len(held) == 0 {
			held = []string{"nothing"}
		}
		parts = append(parts, fmt.Sprintf("%q holds %s and waits for %s", s.h.name, strings.Join(held, ", "), strings.Join(waits, ", ")))
	}
	return strings.Join(parts, "; ")
}

type queuedKey struct{}

// WithQueued returns a copy of ctx that makes Acquire call fn once the
// request holds its place among the purpose's waiters: when the memory is
// granted without waiting, or once the request is queued, before Acquire
// blocks (not when it fails at once). A caller that must let one request
// ask the pool before another (the second is served after the first, first
// come, first served) lets the second go from fn; letting it go before the
// first has called Acquire could let the second take the memory first.
func WithQueued(ctx context.Context, fn func()) context.Context {
	return context.WithValue(ctx, queuedKey{}, fn)
}

// queuedFrom returns the fn WithQueued put in ctx, or nil.
func queuedFrom(ctx context.Context) func() {
	fn, _ := ctx.Value(queuedKey{}).(func())
	return fn
}

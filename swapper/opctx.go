package swapper

import (
	"context"
	"reflect"
	"sync"
)

// OpContexts gives a swapper's operations their contexts: each must end
// when the caller's context ends and when the swapper closes (its base
// context). Deriving one context per operation costs several allocations
// (a cancel context and an AfterFunc registration), and an optimizer step
// issues thousands of operations under one caller context; OpContexts
// keeps the last derivation and hands it to every later operation under
// the same caller context while it is live, so the steady state allocates
// nothing. A caller context that is never done (context.Background) needs
// no derivation at all: the base is the operation's context.
//
// Get and the func it returns are safe for concurrent use.
type OpContexts struct {
	base    context.Context
	onEnd   func()
	baseEnd func() // onEnd (or nothing): an operation under the base
	put     func() // putCached then onEnd, made once so handing it out allocates nothing

	mu      sync.Mutex
	parent  context.Context // the caller context of the cached derivation
	ctx     context.Context // the cached derivation
	release func()
	refs    int // operations using the cached derivation
	closed  bool
}

// NewOpContexts returns the contexts of operations of a swapper whose own
// context is base (done when the swapper closes). onEnd, when not nil, is
// called at the end of every operation, by the func Get returns (a
// swapper's WaitGroup.Done, say).
func NewOpContexts(base context.Context, onEnd func()) *OpContexts {
	o := &OpContexts{base: base, onEnd: onEnd, baseEnd: noop}
	if onEnd != nil {
		o.baseEnd = onEnd
	}
	o.put = o.putCached
	return o
}

// Get returns an operation's context under the caller's ctx, and the func
// the operation calls once it is over (exactly once).
func (o *OpContexts) Get(ctx context.Context) (context.Context, func()) {
	if ctx.Done() == nil {
		return o.base, o.baseEnd
	}
	// Contexts are compared to find the cached one; a context type that
	// cannot be compared (a struct with a map, say) is derived each time.
	comparable := reflect.TypeOf(ctx).Comparable()
	o.mu.Lock()
	if comparable && !o.closed {
		if o.ctx != nil && o.parent == ctx && o.ctx.Err() == nil {
			o.refs++
			o.mu.Unlock()
			return o.ctx, o.put
		}
		if o.refs == 0 {
			if o.release != nil {
				o.release()
			}
			o.ctx, o.release = derive(o.base, ctx)
			o.parent, o.refs = ctx, 1
			d := o.ctx
			o.mu.Unlock()
			return d, o.put
		}
	}
	o.mu.Unlock()
	d, release := derive(o.base, ctx)
	if o.onEnd == nil {
		return d, release
	}
	return d, func() { release(); o.onEnd() }
}

func (o *OpContexts) putCached() {
	o.mu.Lock()
	o.refs--
	o.mu.Unlock()
	if o.onEnd != nil {
		o.onEnd()
	}
}

// Close releases the cached derivation (operations still using it keep
// it: it ends with the base context anyway). Later Gets derive afresh.
func (o *OpContexts) Close() {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.closed = true
	if o.release != nil && o.refs == 0 {
		o.release()
	}
	o.parent, o.ctx, o.release = nil, nil, nil
}

// derive is ctx, also done when base is.
func derive(base, ctx context.Context) (context.Context, func()) {
	d, cancel := context.WithCancel(ctx)
	stop := context.AfterFunc(base, cancel)
	return d, func() { stop(); cancel() }
}

func noop() {}

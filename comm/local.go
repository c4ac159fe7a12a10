package comm

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"sync"
	"time"
)

// DefaultStallTimeout is how long a collective of a Local world waits for
// ranks that have not arrived before it fails the world, naming them. A
// rank computing a layer for minutes is normal; one that has not reached
// a collective the others entered ten minutes ago has almost surely hung
// or died.
const DefaultStallTimeout = 10 * time.Minute

// LocalOptions configure NewLocal.
type LocalOptions struct {
	// StallTimeout bounds how long a collective waits for the other
	// ranks. Default DefaultStallTimeout; negative means no bound (the
	// context and Abort still end a wait).
	StallTimeout time.Duration
}

// NewLocal returns a world of size ranks in this process, one Comm per
// rank, for ranks that run on their own goroutines (tests, and several
// simulated ranks in one program). Reductions are rank-ordered, so
// results are deterministic and equal a sequential reference that adds
// rank 0's value first.
func NewLocal(size int, opts LocalOptions) ([]Comm, error) {
	if size < 1 {
		return nil, fmt.Errorf("comm: local world of %d ranks: need at least 1", size)
	}
	if opts.StallTimeout == 0 {
		opts.StallTimeout = DefaultStallTimeout
	}
	w := &world{size: size, stall: opts.StallTimeout, abortCh: make(chan struct{})}
	out := make([]Comm, size)
	for r := range out {
		out[r] = &local{w: w, rank: r}
	}
	return out, nil
}

type kind int

const (
	kAllGather kind = iota
	kReduceScatter
	kAllReduce32
	kAllReduce64
	kBroadcast
	kBarrier
)

var kindNames = [...]string{"all-gather", "reduce-scatter", "all-reduce", "all-reduce", "broadcast", "barrier"}

func (k kind) String() string { return kindNames[k] }

// args is one rank's part of a collective.
type args struct {
	kind   kind
	op     Op
	root   int
	counts []int
	per    []int       // reduce-scatter: vectors per rank
	bytes  []byte      // all-gather send, broadcast buf
	f32    []float32   // all-reduce buf
	vecs   [][]float32 // reduce-scatter sends
	f64    []float64
}

// round is one collective, as the ranks arrive at it.
type round struct {
	args    []*args
	arrived int
	all     chan struct{} // closed when every rank has arrived
	left    int
	done    chan struct{} // closed when every rank has read what it needs
}

type world struct {
	size  int
	stall time.Duration

	mu      sync.Mutex
	cur     *round // the round ranks are arriving at; nil between rounds
	failed  error  // a *RankError once the world has failed
	abortCh chan struct{}
}

type local struct {
	w         *world
	rank      int
	closed    bool
	scratch32 []float32
	scratch64 []float64
	ones      []int // per for ReduceScatter: one vector per rank
}

var _ Comm = (*local)(nil)

func (c *local) Rank() int { return c.rank }
func (c *local) Size() int { return c.w.size }

// fail ends the world with err (the first failure stays).
func (w *world) fail(err *RankError) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.failLocked(err)
}

func (w *world) failLocked(err *RankError) {
	if w.failed == nil {
		w.failed = err
		close(w.abortCh)
	}
}

func (c *local) Abort(err error) {
	if err == nil {
		err = ErrAborted
	}
	c.w.fail(&RankError{Rank: c.rank, Op: "abort", Err: err})
}

func (c *local) Close() error {
	if c.closed {
		return nil
	}
	c.closed = true
	c.w.mu.Lock()
	defer c.w.mu.Unlock()
	// A rank that leaves while others wait for it, or while a round it
	// has not joined is assembling, would leave them waiting: fail them.
	if c.w.size > 1 && c.w.failed == nil {
		c.w.failLocked(&RankError{Rank: c.rank, Op: "close", Err: ErrClosed})
	}
	return nil
}

// run is the life of one collective on this rank: arrive with a, wait
// for every rank, do this rank's part (work, which reads the other ranks'
// args), then wait until every rank is done reading before returning, so
// that no rank's buffers change while another reads them.
func (c *local) run(ctx context.Context, a *args, work func(all []*args)) error {
	if c.closed {
		return &RankError{Rank: c.rank, Op: a.kind.String(), Err: ErrClosed}
	}
	w := c.w
	if w.size == 1 {
		work([]*args{a})
		return nil
	}
	w.mu.Lock()
	if w.failed == nil && ctx.Err() != nil {
		// A rank that cannot take part fails the world at once, rather
		// than leaving the others to wait for the stall timeout.
		w.failLocked(&RankError{Rank: c.rank, Op: a.kind.String(), Err: ctx.Err()})
	}
	if w.failed != nil {
		err := w.failed
		w.mu.Unlock()
		return err
	}
	r := w.cur
	if r == nil {
		r = &round{args: make([]*args, w.size), all: make(chan struct{}), done: make(chan struct{})}
		w.cur = r
	}
	for q, o := range r.args {
		if o != nil {
			if err := agree(a, o); err != nil {
				e := &RankError{Rank: -1, Op: a.kind.String(), Err: fmt.Errorf("%w: rank %d: %v; rank %d: %v", ErrMismatch, c.rank, describe(a), q, describe(o))}
				w.failLocked(e)
				w.mu.Unlock()
				return e
			}
			break
		}
	}
	r.args[c.rank] = a
	r.arrived++
	if r.arrived == w.size {
		close(r.all)
		w.cur = nil
	}
	w.mu.Unlock()

	if err := c.wait(ctx, r, a.kind, r.all); err != nil {
		return err
	}
	work(r.args)
	w.mu.Lock()
	r.left++
	if r.left == w.size {
		close(r.done)
	}
	w.mu.Unlock()
	// Every rank is past the arrival and has no wait before this point,
	// so every rank reaches it: this wait ends (a failure meanwhile does
	// not matter: the collective itself completed).
	<-r.done
	return nil
}

// wait waits for ch (every rank's arrival); a context that ends or a
// stall fails the world, naming this rank or the ranks missing.
func (c *local) wait(ctx context.Context, r *round, k kind, ch chan struct{}) error {
	w := c.w
	var timer <-chan time.Time
	if w.stall > 0 {
		t := time.NewTimer(w.stall)
		defer t.Stop()
		timer = t.C
	}
	var failure *RankError
	select {
	case <-ch:
		return nil
	case <-w.abortCh:
	case <-ctx.Done():
		failure = &RankError{Rank: c.rank, Op: k.String(), Err: ctx.Err()}
	case <-timer:
		w.mu.Lock()
		var missing []int
		for q, a := range r.args {
			if a == nil {
				missing = append(missing, q)
			}
		}
		w.mu.Unlock()
		failure = &RankError{Rank: -1, Op: k.String(), Err: fmt.Errorf("%w: rank %d waited %v for ranks %v", ErrStalled, c.rank, w.stall, missing)}
		if len(missing) == 1 {
			failure.Rank = missing[0]
		}
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	select {
	case <-ch: // every rank arrived after all: the collective goes on
		return nil
	default:
	}
	if failure != nil {
		w.failLocked(failure)
	}
	return w.failed
}

// agree checks that two ranks' args describe the same collective.
func agree(a, b *args) error {
	switch {
	case a.kind != b.kind:
		return errors.New("different collectives")
	case a.op != b.op:
		return errors.New("different reduction operators")
	case a.root != b.root:
		return errors.New("different roots")
	case !slices.Equal(a.counts, b.counts):
		return errors.New("different counts")
	case !slices.Equal(a.per, b.per):
		return errors.New("different vectors per rank")
	case a.kind == kAllReduce32 && len(a.f32) != len(b.f32), a.kind == kAllReduce64 && len(a.f64) != len(b.f64),
		a.kind == kBroadcast && len(a.bytes) != len(b.bytes):
		return errors.New("different lengths")
	}
	return nil
}

func describe(a *args) string {
	switch a.kind {
	case kAllGather:
		return fmt.Sprintf("%s counts %v", a.kind, a.counts)
	case kReduceScatter:
		return fmt.Sprintf("%s counts %v, vectors per rank %v", a.kind, a.counts, a.per)
	case kAllReduce32:
		return fmt.Sprintf("%s %s of %d float32", a.kind, a.op, len(a.f32))
	case kAllReduce64:
		return fmt.Sprintf("%s %s of %d float64", a.kind, a.op, len(a.f64))
	case kBroadcast:
		return fmt.Sprintf("%s of %d bytes from rank %d", a.kind, len(a.bytes), a.root)
	}
	return a.kind.String()
}

func (c *local) AllGather(ctx context.Context, send, recv []byte, counts []int) error {
	total, err := checkCounts("all-gather", counts, c.w.size)
	if err != nil {
		return err
	}
	if len(send) != counts[c.rank] || len(recv) != total {
		return fmt.Errorf("comm: all-gather: rank %d sends %d bytes (counts say %d) into %d bytes (counts sum to %d)", c.rank, len(send), counts[c.rank], len(recv), total)
	}
	return c.run(ctx, &args{kind: kAllGather, counts: counts, bytes: send}, func(all []*args) {
		off := 0
		for _, a := range all {
			if len(a.bytes) > 0 && &a.bytes[0] == &recv[off] {
				off += len(a.bytes) // gathered in place: already there
				continue
			}
			off += copy(recv[off:], a.bytes)
		}
	})
}

func (c *local) ReduceScatter(ctx context.Context, send, recv []float32, counts []int) error {
	if len(c.ones) != c.w.size {
		c.ones = make([]int, c.w.size)
		for r := range c.ones {
			c.ones[r] = 1
		}
	}
	return c.ReduceScatterMany(ctx, [][]float32{send}, recv, counts, c.ones)
}

func (c *local) ReduceScatterMany(ctx context.Context, sends [][]float32, recv []float32, counts, per []int) error {
	if _, err := checkMany(sends, recv, counts, per, c.rank, c.w.size); err != nil {
		return err
	}
	off, _ := Offsets(counts)
	lo, hi := off[c.rank], off[c.rank]+counts[c.rank]
	return c.run(ctx, &args{kind: kReduceScatter, counts: counts, per: per, vecs: sends}, func(all []*args) {
		first := true
		for _, a := range all {
			for _, v := range a.vecs {
				src := v[lo:hi]
				if first {
					copy(recv, src)
					first = false
					continue
				}
				for i, x := range src {
					recv[i] = recv[i] + x
				}
			}
		}
	})
}

// reduce32 writes the rank-ordered reduction of elements [lo, hi) of
// every rank's f32 into dst.
func reduce32(dst []float32, all []*args, lo, hi int, op Op) {
	copy(dst, all[0].f32[lo:hi])
	for _, a := range all[1:] {
		src := a.f32[lo:hi]
		if op == Sum {
			for i, x := range src {
				dst[i] = dst[i] + x
			}
			continue
		}
		for i, x := range src {
			dst[i] = max32(dst[i], x)
		}
	}
}

func max32(a, b float32) float32 {
	if a != a || b != b {
		return float32(math.NaN())
	}
	return max(a, b)
}

func (c *local) AllReduce(ctx context.Context, buf []float32, op Op) error {
	if !op.valid() {
		return fmt.Errorf("comm: all-reduce: unknown operator %v", op)
	}
	if cap(c.scratch32) < len(buf) {
		c.scratch32 = make([]float32, len(buf))
	}
	tmp := c.scratch32[:len(buf)]
	err := c.run(ctx, &args{kind: kAllReduce32, op: op, f32: buf}, func(all []*args) {
		reduce32(tmp, all, 0, len(buf), op)
	})
	if err == nil {
		copy(buf, tmp) // after every rank has read buf
	}
	return err
}

func (c *local) AllReduceFloat64(ctx context.Context, buf []float64, op Op) error {
	if !op.valid() {
		return fmt.Errorf("comm: all-reduce: unknown operator %v", op)
	}
	if cap(c.scratch64) < len(buf) {
		c.scratch64 = make([]float64, len(buf))
	}
	tmp := c.scratch64[:len(buf)]
	err := c.run(ctx, &args{kind: kAllReduce64, op: op, f64: buf}, func(all []*args) {
		copy(tmp, all[0].f64)
		for _, a := range all[1:] {
			for i, x := range a.f64 {
				if op == Sum {
					tmp[i] = tmp[i] + x
				} else if tmp[i] != tmp[i] || x != x {
					tmp[i] = math.NaN()
				} else {
					tmp[i] = max(tmp[i], x)
				}
			}
		}
	})
	if err == nil {
		copy(buf, tmp)
	}
	return err
}

func (c *local) Broadcast(ctx context.Context, buf []byte, root int) error {
	if root < 0 || root >= c.w.size {
		return fmt.Errorf("comm: broadcast: root %d is outside the world of %d ranks", root, c.w.size)
	}
	return c.run(ctx, &args{kind: kBroadcast, root: root, bytes: buf}, func(all []*args) {
		if c.rank != root {
			copy(buf, all[root].bytes)
		}
	})
}

func (c *local) Barrier(ctx context.Context) error {
	return c.run(ctx, &args{kind: kBarrier}, func([]*args) {})
}

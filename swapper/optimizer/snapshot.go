package optimizer

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/zinfio/zinf/buffers"
)

// ErrNotInMemory: SnapshotStates on an optimizer whose states live in a
// store (Options.Store set); pin the store's versions instead
// (swapper.Store.Pin on the keys of StateRecords).
var ErrNotInMemory = errors.New("optimizer: states not kept in pinned memory")

// StateKind names one of a tensor's optimizer states: the master, then
// the rule's states in Hyper.StateNames order (StateKind(1+i) is state i).
type StateKind int

// The states, in the order a sub-group's record holds them.
const (
	Master   StateKind = iota // fp32 master weights
	ExpAvg                    // Adam's exp_avg (state 0 of every rule)
	ExpAvgSq                  // Adam's exp_avg_sq
)

// StateSnapshot is a read-only view of optimizer states kept in pinned
// memory (Options.Store nil) as of the last step committed before
// SnapshotStates. Nothing is copied: the snapshot holds references to the
// sub-groups' current records, and steps never write a held record (see
// SnapshotStates), so the view stays valid while training steps on.
// Release gives the records back; the views from Segments must not be used
// after it. Its methods are safe for concurrent use; Release may be called
// from any goroutine, before or after the optimizer is closed.
type StateSnapshot struct {
	o        *Optimizer
	step     int
	tensors  map[string][]snapRecord
	once     sync.Once
	released atomic.Bool
}

// snapRecord is one held sub-group record.
type snapRecord struct {
	sg  *subGroup
	buf *buffers.Buffer
	n   int // elements of the sub-group
}

// SnapshotStates takes a snapshot of the named tensors' states (every
// registered tensor when names is empty) as of the last committed step,
// without copying: it retains each sub-group's current record. It may be
// called between steps or while a step transaction is open (the snapshot
// then has the states before that step), and takes microseconds.
//
// A step writes each sub-group's new record into the buffer of the record
// before the current one and flips them at commit, so the record held now
// would be written again by the second step from now. While a snapshot
// holds it, that step instead builds the record in a fresh buffer from the
// pool and the held one is given back to the pool when the snapshot is
// released: snapshotted bytes never change. The fresh buffer is one record
// (about 12 bytes per element, see LayoutFor) beyond the two copies Register reserved; if the pool has
// none free, the step waits for one (backpressure: a training loop that
// steps twice while an asynchronous checkpoint of these states still
// drains waits for the drain, unless the pool has that headroom).
// LoadState likewise replaces a held record instead of overwriting it.
//
// It fails with ErrNotInMemory when the states live in a store, with
// ErrNotRegistered for an unknown name and ErrClosed after Close. On error
// nothing is held.
func (o *Optimizer) SnapshotStates(names ...string) (*StateSnapshot, error) {
	o.opMu.Lock()
	defer o.opMu.Unlock()
	fail := func(name string, err error) error {
		return &Error{Op: "snapshot", Tensor: name, SubGroup: -1, Err: err}
	}
	if o.closed {
		return nil, fail("", ErrClosed)
	}
	if o.opts.Store != nil {
		return nil, fail("", ErrNotInMemory)
	}
	o.mu.Lock()
	step := o.step
	if len(names) == 0 {
		for _, t := range o.tensors {
			names = append(names, t.name)
		}
	}
	ts := make([]*tensor, 0, len(names))
	for _, name := range names {
		t, ok := o.byName[name]
		if !ok {
			o.mu.Unlock()
			return nil, fail(name, ErrNotRegistered)
		}
		ts = append(ts, t)
	}
	o.mu.Unlock()
	s := &StateSnapshot{o: o, step: step, tensors: make(map[string][]snapRecord, len(ts))}
	o.memMu.Lock()
	defer o.memMu.Unlock()
	for _, t := range ts {
		if _, dup := s.tensors[t.name]; dup {
			continue
		}
		recs := make([]snapRecord, len(t.sgs))
		for i, sg := range t.sgs {
			b := sg.mem[sg.cur]
			b.Retain()
			sg.held[sg.cur]++
			recs[i] = snapRecord{sg: sg, buf: b, n: sg.n}
		}
		s.tensors[t.name] = recs
	}
	return s, nil
}

// Step is the optimizer's step count when the snapshot was taken: the
// states are those after that many steps (or after LoadState).
func (s *StateSnapshot) Step() int { return s.step }

// Names returns the snapshot's tensors, in no particular order.
func (s *StateSnapshot) Names() []string {
	out := make([]string, 0, len(s.tensors))
	for n := range s.tensors {
		out = append(out, n)
	}
	return out
}

// Len returns the number of elements of name's partition, and whether the
// snapshot holds name.
func (s *StateSnapshot) Len(name string) (int, bool) {
	recs, ok := s.tensors[name]
	n := 0
	for _, r := range recs {
		n += r.n
	}
	return n, ok
}

// Segments returns state k of name as little-endian fp32 bytes, without a
// copy (states stored narrower than fp32, see Options.StateFormat: a
// decoded copy): one slice per sub-group, in element order; back to back
// they are the partition's state. The slices are read-only and valid until
// Release. ok is false for a name the snapshot does not hold, an invalid
// kind, and after Release.
func (s *StateSnapshot) Segments(name string, k StateKind) (segs [][]byte, ok bool) {
	recs, ok := s.tensors[name]
	if !ok || k < Master || int(k) >= s.o.width || s.released.Load() {
		return nil, false
	}
	segs = make([][]byte, len(recs))
	for i, r := range recs {
		if l := r.sg.lay; k != Master && l.compressed() {
			// Narrower than fp32 (Options.StateFormat): a decoded copy.
			wide := make([]float32, r.n)
			l.decode(wide, r.buf.Float32(), int(k))
			segs[i] = buffers.AsBytes(wide)
			continue
		}
		lo := r.sg.lay.Offsets[k]
		segs[i] = r.buf.Bytes()[lo : lo+4*int64(r.n)]
	}
	return segs, true
}

// Read copies state k of name into dst (the partition's length).
func (s *StateSnapshot) Read(name string, k StateKind, dst []float32) error {
	segs, ok := s.Segments(name, k)
	if !ok {
		return &Error{Op: "snapshot-read", Tensor: name, SubGroup: -1, Err: fmt.Errorf("%w: not in the snapshot (or state %d invalid, or released)", ErrNotRegistered, k)}
	}
	if n, _ := s.Len(name); len(dst) != n {
		return &Error{Op: "snapshot-read", Tensor: name, SubGroup: -1, Err: fmt.Errorf("%w: the partition has %d elements, dst %d", ErrLength, n, len(dst))}
	}
	off := 0
	for _, seg := range segs {
		off += copy(dst[off:], buffers.Float32Bytes(seg))
	}
	return nil
}

// Release gives back every record the snapshot holds; those that steps
// have replaced meanwhile go back to the pool. It is idempotent.
func (s *StateSnapshot) Release() {
	s.once.Do(func() {
		s.released.Store(true)
		o := s.o
		for _, recs := range s.tensors {
			for _, r := range recs {
				o.memMu.Lock()
				for k, b := range r.sg.mem {
					if b == r.buf { // still the sub-group's: no longer held by us
						r.sg.held[k]--
						break
					}
				}
				o.memMu.Unlock()
				r.buf.Release()
			}
		}
	})
}

package zgomlx

import (
	"fmt"

	"github.com/gomlx/compute"
	"github.com/gomlx/compute/shapes"
	"github.com/gomlx/gomlx/core/tensors"

	"github.com/zinfio/zinf/contrib/gomlx/internal/layerexec"
)

type compBuf = compute.Buffer

// slot is a swap-in buffer: a GoMLX tensor over a backend shared buffer,
// so bytes written into it are what an executor reads, with no copy and no
// allocation. A slot is bound to one variable while its layer runs; between
// layers it keeps the values it was given and the version they are of, so
// a layer whose variables are all still there (the last layer of the
// forward pass, first of the backward one) is not read again.
type slot struct {
	t       *tensors.Tensor
	buf     compute.Buffer
	bytes   []byte
	owner   *Var   // whose values it holds, nil when none
	version uint64 // the parameter version of those values
	busy    bool   // bound for the layer running now
	keep    bool   // its values are promised to a layer later in the pass
}

// slotPool hands out slots by class (shape and dtype). It grows only
// while the largest layer of a class has not been seen, so a steady-state
// swap-in allocates nothing. Only the loop goroutine uses it.
type slotPool struct {
	backend compute.Backend
	classes [][]*slot
	bytes   int64 // held by every slot, for metrics
	// spare are buffers made ahead (Offload.spare) that newSlot hands out
	// for their shape before it allocates.
	spare []*slot
}

func newSlotPool(backend compute.Backend, classes int) *slotPool {
	return &slotPool{backend: backend, classes: make([][]*slot, classes)}
}

// holds reports whether v's last slot still has v's values of version.
func (v *Var) holds(version uint64) bool {
	s := v.slot
	return s != nil && s.owner == v && s.version == version
}

// acquire binds a slot to v and reports whether it already holds v's
// values of version (nothing to read). A new owner's slot is chosen among
// the free ones: holding nothing first, then stale values, then values
// nobody was promised; only when none is free is a slot allocated.
func (p *slotPool) acquire(v *Var, version uint64) (*slot, bool, error) {
	if s := v.slot; s != nil && !s.busy && s.owner == v {
		s.busy = true
		return s, s.version == version, nil
	}
	var pick *slot
	rank := 3
	for _, s := range p.classes[v.class] {
		if s.busy || s.keep {
			continue
		}
		r := 2
		switch {
		case s.owner == nil:
			r = 0
		case s.version != version || s.owner.slot != s:
			r = 1
		}
		if r < rank {
			pick, rank = s, r
			if r == 0 {
				break
			}
		}
	}
	if pick == nil {
		s, err := p.newSlot(v.Shape)
		if err != nil {
			return nil, false, fmt.Errorf("zgomlx: a swap-in buffer for %q (%s): %w", v.Name, v.Shape, err)
		}
		p.classes[v.class] = append(p.classes[v.class], s)
		pick = s
	}
	if o := pick.owner; o != nil && o.slot == pick {
		o.slot = nil
	}
	pick.owner, pick.version, pick.busy = v, 0, true
	v.slot = pick
	return pick, false, nil
}

// newSlot allocates a shared-buffer tensor of shape and keeps its buffer
// and its bytes.
func (p *slotPool) newSlot(shape shapes.Shape) (*slot, error) {
	for i, s := range p.spare {
		if s.t.Shape().Equal(shape) {
			p.spare = append(p.spare[:i], p.spare[i+1:]...)
			p.bytes += int64(len(s.bytes))
			return s, nil
		}
	}
	b, err := layerexec.NewBuffer(p.backend, shape)
	if err != nil {
		return nil, err
	}
	s := &slot{t: b.T, buf: b.Buf, bytes: b.Bytes}
	p.bytes += int64(len(s.bytes))
	return s, nil
}

// release ends the binding of vars' slots (they keep their values).
func (p *slotPool) release(vars []*Var) {
	for _, v := range vars {
		if v.slot != nil {
			v.slot.busy = false
		}
		v.cur = nil
	}
}

// forget marks a slot's values as invalid (a read into it failed).
func (s *slot) forget() {
	s.owner = nil
	s.version = 0
}

// unkeepAll clears every promise (a pass ended or was abandoned).
func (p *slotPool) unkeepAll() {
	for _, c := range p.classes {
		for _, s := range c {
			s.keep = false
		}
	}
}

// close frees every slot.
func (p *slotPool) close() {
	for _, c := range p.classes {
		for _, s := range c {
			if s.owner != nil && s.owner.slot == s {
				s.owner.slot = nil
			}
			layerexec.Finalize(s.t)
		}
	}
	p.classes = nil
	p.bytes = 0
	freeSlots(p.spare)
	p.spare = nil
}

// freeSlots frees slots that belong to no pool class.
func freeSlots(ss []*slot) {
	for _, s := range ss {
		layerexec.Finalize(s.t)
	}
}

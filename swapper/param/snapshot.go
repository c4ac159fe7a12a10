package param

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/zinfio/zinf/accel"
	"github.com/zinfio/zinf/buffers"
	"github.com/zinfio/zinf/swapper"
)

// ParamSnapshot is a read-only view of parameter partitions as they were
// when Snapshot took it, in the parameter dtype. CPU-tier partitions are
// not copied: the snapshot holds a reference to their current pinned
// buffers, whose bytes never change (CommitUpdates and Init install new
// buffers instead of writing the current one), so the view stays valid
// while training commits new values. GPU-tier partitions are copied to
// pinned host buffers when the snapshot is taken.
//
// Release gives the buffers back; the views returned by Bytes must not be
// used after it. Until then the snapshot costs the buffers it holds: a
// CPU-tier partition updated since is held twice (old and new values). The
// methods are safe for concurrent use, and Release may be called from any
// goroutine, before or after the Swapper is closed.
type ParamSnapshot struct {
	dtype swapper.DType
	parts map[string]snapPart

	once     sync.Once
	released atomic.Bool
}

type snapPart struct {
	blk   *block // nil for an empty partition
	bytes int
}

// Snapshot takes a consistent snapshot of the named partitions (every
// CPU- and GPU-tier one when names is empty): no CommitUpdates falls
// between them. CPU-tier partitions are retained, not copied; GPU-tier partitions
// are copied to host buffers from the pool (which may wait for pool memory
// under ctx). NVMe-tier partitions are refused with an error wrapping
// ErrNotInMemory: they live in the store, which pins its versions itself
// (swapper.Store.Pin). A partition never given values fails with
// ErrNotInitialized. On error nothing is held.
func (s *Swapper) Snapshot(ctx context.Context, names ...string) (*ParamSnapshot, error) {
	ps := &ParamSnapshot{dtype: s.opts.DType, parts: make(map[string]snapPart)}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil, &swapper.TensorError{Op: "snapshot", Err: ErrClosed}
	}
	if len(names) == 0 {
		for n, t := range s.tensors {
			if t.tier != swapper.TierNVMe {
				names = append(names, n)
			}
		}
	}
	var onDevice []*tensor
	var err error
	for _, name := range names {
		var t *tensor
		if t, err = s.lookupLocked("snapshot", name); err != nil {
			break
		}
		if _, dup := ps.parts[name]; dup {
			continue
		}
		if t.tier == swapper.TierNVMe {
			err = &swapper.TensorError{Op: "snapshot", Tensor: name, Err: ErrNotInMemory}
			break
		}
		if t.n == 0 {
			ps.parts[name] = snapPart{}
			continue
		}
		if !t.inited || t.cur == nil {
			err = &swapper.TensorError{Op: "snapshot", Tensor: name, Err: ErrNotInitialized}
			break
		}
		t.cur.retain() // t.cur is only released under s.mu, after swapping it out
		ps.parts[name] = snapPart{blk: t.cur, bytes: t.bytes}
		if t.tier == swapper.TierGPU {
			onDevice = append(onDevice, t)
		}
	}
	if err == nil {
		s.wg.Add(1) // the device copies below: Close waits for them
	}
	s.mu.Unlock()
	if err != nil {
		ps.Release()
		return nil, err
	}
	defer s.wg.Done()
	for _, t := range onDevice {
		p := ps.parts[t.name]
		host, err := s.hostCopy(ctx, t, p.blk)
		p.blk.release() // the device copy: the host copy replaces it
		if err != nil {
			delete(ps.parts, t.name)
			ps.Release()
			return nil, err
		}
		p.blk = host
		ps.parts[t.name] = p
	}
	return ps, nil
}

// hostCopy copies a GPU partition's bytes, as they are, into a new host
// block from the pool.
func (s *Swapper) hostCopy(ctx context.Context, t *tensor, dev *block) (*block, error) {
	buf, err := s.acquireBuffer(ctx, t.bytes, buffers.PurposeCheckpoint)
	if err != nil {
		return nil, &swapper.TensorError{Op: "snapshot", Tensor: t.name, Err: err}
	}
	if err := s.deviceCopy(func(st accel.Stream) error {
		return s.dev.CopyFromDevice(st, buf.Bytes(), dev.mem, 0)
	}); err != nil {
		buf.Release()
		return nil, &swapper.TensorError{Op: "snapshot", Tensor: t.name, Err: err}
	}
	return hostBlock(buf), nil
}

// DType is the dtype of the snapshot's bytes (the swapper's).
func (ps *ParamSnapshot) DType() swapper.DType { return ps.dtype }

// Names returns the snapshot's partitions, in no particular order.
func (ps *ParamSnapshot) Names() []string {
	out := make([]string, 0, len(ps.parts))
	for n := range ps.parts {
		out = append(out, n)
	}
	return out
}

// Bytes returns name's partition as it was at Snapshot, PartitionLen
// elements of DType (empty for an empty partition), without a copy. The
// slice is read-only and valid until Release. ok is false for a name the
// snapshot does not hold, and after Release.
func (ps *ParamSnapshot) Bytes(name string) (b []byte, ok bool) {
	if ps.released.Load() {
		return nil, false
	}
	p, ok := ps.parts[name]
	if !ok || p.blk == nil {
		return []byte{}, ok
	}
	return p.blk.buf.Bytes()[:p.bytes], true
}

// ReadFloat32 converts name's partition as it was at Snapshot to fp32 into
// dst (PartitionLen long).
func (ps *ParamSnapshot) ReadFloat32(name string, dst []float32) error {
	b, ok := ps.Bytes(name)
	if !ok {
		return &swapper.TensorError{Op: "snapshot-read", Tensor: name, Err: fmt.Errorf("%w: not in the snapshot", ErrUnknown)}
	}
	if len(dst)*ps.dtype.Size() != len(b) {
		return &swapper.TensorError{Op: "snapshot-read", Tensor: name, Err: fmt.Errorf("destination has %d elements, the partition %d", len(dst), len(b)/ps.dtype.Size())}
	}
	buffers.Decode(ps.dtype, dst, b)
	return nil
}

// Release gives back every buffer the snapshot holds. It is idempotent.
func (ps *ParamSnapshot) Release() {
	ps.once.Do(func() {
		ps.released.Store(true)
		for _, p := range ps.parts {
			if p.blk != nil {
				p.blk.release()
			}
		}
	})
}

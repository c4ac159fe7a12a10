package param

import (
	"context"
	"errors"
	"fmt"

	"github.com/zinfio/zinf/accel"
	"github.com/zinfio/zinf/buffers"
	"github.com/zinfio/zinf/swapper"
)

// staged is a new version of a partition, written aside: for NVMe under a
// staging key of the store (key), for CPU and GPU tiers in a new copy
// (blk). done is closed when it is complete; err is set before.
type staged struct {
	t    *tensor
	key  string
	blk  *block
	done chan struct{}
	err  error
}

// Wait blocks until the staged write is on disk (NVMe) and returns its
// error; CPU and GPU updates are complete when StageUpdate returns.
func (st *staged) Wait() error {
	<-st.done
	return st.err
}

func (st *staged) disposeBlock() {
	if st.blk != nil {
		st.blk.release()
		st.blk = nil
	}
}

type doneWaiter struct{}

func (doneWaiter) Wait() error { return nil }

// prepare converts values and writes them aside as a new version of t:
// NVMe to store key key (asynchronously, copy-on-write), CPU to a new pool
// buffer, GPU to a new device allocation. The caller holds a Close count
// (begin), so the write's goroutine may add its own.
func (s *Swapper) prepare(ctx context.Context, t *tensor, values []float32, key string) (*staged, error) {
	if t.streamed {
		return s.stageAll(ctx, t, values, key)
	}
	st := &staged{t: t, done: make(chan struct{})}
	switch t.tier {
	case swapper.TierNVMe:
		buf, err := s.acquireBuffer(ctx, int(s.store.PaddedLen(int64(t.bytes))), buffers.PurposeParams)
		if err != nil {
			return nil, &swapper.TensorError{Op: "swap-out", Tensor: t.name, Err: err}
		}
		b := buf.Bytes()[:t.bytes]
		buffers.Encode(s.opts.DType, b, values)
		p, err := s.store.WriteAsync(key, b)
		if err != nil {
			buf.Release()
			return nil, err
		}
		st.key = key
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			err := p.Wait()
			buf.Release() // the store has the bytes, or kept the old version
			s.mu.Lock()
			if err == nil {
				s.stats.BytesWritten += int64(t.bytes)
			}
			s.mu.Unlock()
			st.err = err
			close(st.done)
		}()
		return st, nil
	case swapper.TierCPU:
		buf, err := s.acquireBuffer(ctx, t.bytes, buffers.PurposeParams)
		if err != nil {
			return nil, &swapper.TensorError{Op: "stage", Tensor: t.name, Err: err}
		}
		buffers.Encode(s.opts.DType, buf.Bytes(), values)
		st.blk = hostBlock(buf)
	default: // TierGPU
		mem, err := s.dev.Alloc(int64(t.bytes))
		if err != nil {
			return nil, &swapper.TensorError{Op: "stage", Tensor: t.name, Err: err}
		}
		blk := deviceBlock(s.dev, mem, s.log)
		stage, err := s.acquireBuffer(ctx, t.bytes, buffers.PurposeStaging)
		if err != nil {
			blk.release()
			return nil, &swapper.TensorError{Op: "stage", Tensor: t.name, Err: err}
		}
		buffers.Encode(s.opts.DType, stage.Bytes(), values)
		err = s.deviceCopy(func(str accel.Stream) error {
			return s.dev.CopyToDevice(str, mem, 0, stage.Bytes())
		})
		stage.Release()
		if err != nil {
			blk.release()
			return nil, &swapper.TensorError{Op: "stage", Tensor: t.name, Err: err}
		}
		st.blk = blk
	}
	close(st.done)
	return st, nil
}

// installLocked makes st (complete, successful; for NVMe already renamed
// to the tensor's key) t's current version.
func (s *Swapper) installLocked(t *tensor, st *staged) {
	t.gen++
	t.inited = true
	t.failed = nil // about an older version
	if t.tier == swapper.TierNVMe {
		s.invalidateLocked(t)
		return
	}
	// CPU and GPU copies are copy-on-write: the staged copy becomes the
	// current one and the old one is never written again, so readers and
	// snapshots (Snapshot) holding it keep the old values until they let
	// go. Nothing may ever write t.cur in place.
	old := t.cur
	t.cur, st.blk = st.blk, nil
	if old != nil {
		old.release()
	}
}

// invalidateLocked forgets every copy of t older than t.gen: the cache
// entry goes, and a resident copy or a swap-in in flight is swapped in
// again, so that later reads see the new values.
func (s *Swapper) invalidateLocked(t *tensor) {
	if s.cache != nil {
		s.cache.Del(t.name)
	}
	switch t.state {
	case Resident:
		if t.n == 0 {
			return
		}
		_, prefetched := s.unclaimed[t]
		_, pending := s.pending[t]
		s.claimLocked(t)
		blk := t.res
		t.res, t.state = nil, OnNVMe
		s.gate.release()
		blk.release()
		// A copy in use is fetched again as if waited for (not
		// preemptible); one a Wait in progress swapped in, for that Wait.
		s.startFlightLocked(t, !prefetched).keep = !prefetched && !pending
	case InFlight:
		demand, keep := t.flight.demand, t.flight.keep
		s.dropFlightLocked(t)
		s.startFlightLocked(t, demand).keep = keep
	}
}

// dispose throws a staged version away once its write is done.
func (s *Swapper) dispose(st *staged) {
	<-st.done
	if st.key != "" && st.key != st.t.key {
		s.store.Delete(st.key)
	}
	st.disposeBlock()
}

// StageUpdate converts values (fp32, PartitionLen long: the optimizer's
// new partition) to the dtype and writes it aside; nothing is visible until
// CommitUpdates. An NVMe update is an asynchronous copy-on-write to a
// staging key: the returned Waiter reports when it is on disk (an ENOSPC
// or I/O error surfaces there and from CommitUpdates). CPU and GPU updates
// are held in new buffers and complete on return. Staging a tensor again
// replaces its earlier staged update.
func (s *Swapper) StageUpdate(ctx context.Context, name string, values []float32) (Waiter, error) {
	t, ctx, done, err := s.begin(ctx, "stage", name)
	if err != nil {
		return nil, err
	}
	defer s.wg.Done()
	defer done()
	if len(values) != t.n {
		return nil, &swapper.TensorError{Op: "stage", Tensor: name, Err: fmt.Errorf("%d values for a partition of %d elements", len(values), t.n)}
	}
	if t.n == 0 {
		return doneWaiter{}, nil
	}
	s.mu.Lock()
	s.stageSeq++
	key := fmt.Sprintf("%s%s%d", t.key, stagingMark, s.stageSeq)
	s.mu.Unlock()
	st, err := s.prepare(ctx, t, values, key)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		s.dispose(st)
		return nil, &swapper.TensorError{Op: "stage", Tensor: name, Err: ErrClosed}
	}
	old := t.staged
	t.staged = st
	s.mu.Unlock()
	if old != nil {
		s.dispose(old)
	}
	return st, nil
}

// CommitUpdates makes every staged update current at once. It waits for
// the staged writes; if any failed it changes nothing and returns their
// errors (each naming its tensor): call DiscardUpdates and stage again.
// Otherwise NVMe versions are renamed into place in one atomic store
// operation, CPU and GPU copies are swapped, and resident copies, swap-ins
// in flight and CPU-cache entries of the updated tensors are invalidated
// (resident ones are swapped in again), so later reads see the new values.
// A replaced CPU or GPU copy is never written again: readers and snapshots
// (Snapshot) holding it keep the old values until they release it.
func (s *Swapper) CommitUpdates() error {
	s.commitMu.Lock()
	defer s.commitMu.Unlock()
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return ErrClosed
	}
	var snap []*staged
	for _, t := range s.tensors {
		if t.staged != nil {
			snap = append(snap, t.staged)
		}
	}
	s.mu.Unlock()
	var errs []error
	for _, st := range snap {
		if err := st.Wait(); err != nil {
			errs = append(errs, fmt.Errorf("staged update of %q: %w", st.t.name, err))
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("param: commit refused, no parameter changed (discard the updates and stage them again): %w", errors.Join(errs...))
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return ErrClosed
	}
	var pairs [][2]string
	live := snap[:0]
	for _, st := range snap {
		if st.t.staged != st {
			continue // replaced by a newer StageUpdate meanwhile: next commit
		}
		live = append(live, st)
		if st.key != "" {
			pairs = append(pairs, [2]string{st.key, st.t.key})
		}
	}
	if len(pairs) > 0 {
		if err := s.store.Rename(pairs...); err != nil {
			return fmt.Errorf("param: commit refused, no parameter changed: %w", err)
		}
	}
	for _, st := range live {
		st.t.staged = nil
		s.installLocked(st.t, st)
	}
	published := false
	for _, t := range s.tensors {
		if t.prev != nil {
			t.prev.drop(s)
			t.prev = nil
			published = true
		}
		s.releaseHeldLocked(t)
	}
	if len(live) > 0 || published {
		s.stats.Commits++
	}
	return nil
}

// DiscardUpdates drops every staged update (after a failed optimizer
// step): staged writes are waited for and deleted, staged buffers freed.
// Every update published since the last commit (PublishUpdate) is put
// back: the previous version becomes current again, and copies of the
// published one are invalidated as a commit invalidates them. The values
// of the last commit are then current everywhere.
func (s *Swapper) DiscardUpdates() {
	s.commitMu.Lock()
	defer s.commitMu.Unlock()
	s.dropBuilds()
	s.mu.Lock()
	var snap []*staged
	for _, t := range s.tensors {
		if t.staged != nil {
			snap = append(snap, t.staged)
			t.staged = nil
		}
		if t.prev != nil {
			s.revertLocked(t)
		}
		s.releaseHeldLocked(t)
	}
	s.mu.Unlock()
	for _, st := range snap {
		s.dispose(st)
	}
}

// HoldPrefetch says that updates of the named tensors are coming
// (published one by one, as an optimizer step committing asynchronously
// writes them): a Prefetch of one of them is deferred until its update is
// current — PublishUpdate, or CommitUpdates or DiscardUpdates, which end
// every hold — instead of reading the version about to be replaced and
// reading again after it. Wait is not deferred: it reads what is current.
// Release drops a deferred prefetch.
func (s *Swapper) HoldPrefetch(names ...string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, name := range names {
		if t, ok := s.tensors[name]; ok && t.tier == swapper.TierNVMe && !t.streamed && t.n > 0 {
			t.held = true
		}
	}
}

// releaseHeldLocked ends t's hold and starts the prefetch it deferred.
func (s *Swapper) releaseHeldLocked(t *tensor) {
	if !t.held {
		return
	}
	t.held = false
	if t.wanted {
		t.wanted = false
		if t.state == OnNVMe && t.inited && !s.closed {
			s.startFlightLocked(t, false)
		}
	}
}

// published is the version of a tensor that PublishUpdate replaced: for
// NVMe under the store key key, for CPU and GPU tiers the copy blk.
type published struct {
	key string
	blk *block
}

// prevMark names the store key a published tensor's previous version is
// kept under until the step commits or is discarded.
const prevMark = "@prev"

// drop forgets the previous version for good.
func (p *published) drop(s *Swapper) {
	if p.key != "" {
		s.store.Delete(p.key)
	}
	if p.blk != nil {
		p.blk.release()
		p.blk = nil
	}
}

// PublishUpdate makes name's staged update current now, before the step
// commits, keeping the version it replaces: reads from then on see the new
// values (resident copies, swap-ins in flight and cache entries are
// invalidated as CommitUpdates invalidates them), CommitUpdates drops the
// kept version and DiscardUpdates puts it back. It waits for the staged
// write; if that failed it changes nothing and returns the error. A tensor
// with nothing staged (a rank's empty partition, or one published already)
// is left as it is. This is how an optimizer step overlaps the next
// forward pass (optimizer.StepTxn.CommitAsync): each layer's parameters
// become readable as soon as they are written, while the step as a whole
// can still be undone.
func (s *Swapper) PublishUpdate(name string) error {
	s.commitMu.Lock()
	defer s.commitMu.Unlock()
	s.mu.Lock()
	t, err := s.lookupLocked("publish", name)
	if err != nil {
		s.mu.Unlock()
		return err
	}
	st := t.staged
	if st == nil {
		s.releaseHeldLocked(t)
	}
	s.mu.Unlock()
	if st == nil {
		return nil
	}
	if err := st.Wait(); err != nil {
		return &swapper.TensorError{Op: "publish", Tensor: name, Err: fmt.Errorf("staged update: %w", err)}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return &swapper.TensorError{Op: "publish", Tensor: name, Err: ErrClosed}
	}
	if t.staged != st {
		return nil // replaced or dropped meanwhile
	}
	pub := t.prev
	if pub == nil {
		pub = &published{}
	}
	if st.key != "" {
		if pub.key == "" {
			// The first publish of the step keeps the committed version.
			pub.key = t.key + prevMark
			if err := s.store.Rename([2]string{t.key, pub.key}, [2]string{st.key, t.key}); err != nil {
				return &swapper.TensorError{Op: "publish", Tensor: name, Err: err}
			}
		} else if err := s.store.Rename([2]string{st.key, t.key}); err != nil {
			return &swapper.TensorError{Op: "publish", Tensor: name, Err: err}
		}
	}
	t.staged = nil
	if t.tier != swapper.TierNVMe && pub.blk == nil {
		// Keep the committed copy rather than release it.
		pub.blk, t.cur = t.cur, nil
	}
	t.prev = pub
	s.installLocked(t, st)
	s.releaseHeldLocked(t)
	s.stats.Published++
	return nil
}

// revertLocked puts t's committed version back after PublishUpdate.
func (s *Swapper) revertLocked(t *tensor) {
	pub := t.prev
	t.prev = nil
	if pub.key != "" {
		if err := s.store.Rename([2]string{pub.key, t.key}); err != nil {
			// Only a closed store refuses a rename of a key it holds.
			s.log.Error("param: could not put back the committed version of a published tensor", "tensor", t.name, "error", err)
		}
	}
	if pub.blk != nil {
		s.installLocked(t, &staged{t: t, blk: pub.blk})
		pub.blk = nil
	} else {
		t.gen++
		s.invalidateLocked(t)
	}
	s.stats.Reverted++
}

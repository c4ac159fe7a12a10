package checkpoint

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sync/errgroup"

	"github.com/zinfio/zinf/aio"
	"github.com/zinfio/zinf/buffers"
	"github.com/zinfio/zinf/swapper"
)

// SaverOptions configure a Saver. The zero value is usable.
type SaverOptions struct {
	// MaxSnapshotBytes caps the pinned memory one snapshot may take (see
	// Saver). A state whose snapshot would be larger fails at once with
	// ErrSnapshotTooLarge, before anything is copied; use a synchronous
	// Save for it. Default 0: no cap (the snapshot is as large as the
	// checkpoint).
	MaxSnapshotBytes int64
	// Logger, default slog.Default().
	Logger *slog.Logger
}

// Saver saves checkpoints asynchronously: SaveAsync takes a consistent
// snapshot of the state and returns; the snapshot drains to disk while
// training continues.
//
// The snapshot is three things. Tensors in memory (FromBytes, FromFunc)
// are copied, a plain memcpy, Parallel files at once; their checksums are
// computed later, while the snapshot drains (CRC-32C is slower than the
// copy), and the drain starts once the copy is done (see drain for why and
// what it measured). Tensors in a
// swap store (FromStore, FromStoreRanges) are not copied at all: SaveAsync
// pins their current versions (swapper.Store.Pin; the store is
// copy-on-write, so training's later writes go to new extents) and the
// drain reads them from there, so they cost SaveAsync next to nothing.
// Tensors in copy-on-write memory (FromPinned) are not copied either:
// SaveAsync calls their pin functions, the drain reads the bytes they hold
// still and releases them when the save is done or has failed.
//
// Memory: the snapshot is the checkpoint's files laid out back to back
// (each starting at a 4 KiB-aligned position) in StagingBytes chunks of
// pinned memory from the Saver's own pool, so it costs the checkpoint's
// total size rounded up to one chunk (pinned store and FromPinned tensors
// included: their bytes land there when the drain reads them), plus, while draining, one
// pinned buffer per file written at once for the store tensor being read.
// Each chunk is written straight from the snapshot with O_DIRECT (no
// second copy) and returned to the pool once written, so the snapshot
// shrinks as the save drains. The pool is kept for the next
// save (it is remapped only when a bigger one is needed) and freed by
// Close. MaxSnapshotBytes bounds it. A pinned store version costs its
// extents in the swap files until the drain is done.
//
// At most one save is in flight: SaveAsync first waits for the previous
// save to finish (backpressure: a job that checkpoints faster than the disk
// drains slows down instead of piling up snapshots); if its context ends
// while waiting, it returns an error wrapping ErrSaveInFlight and the
// context's error. Methods are safe for concurrent use; Close is called
// once.
type Saver struct {
	opts    SaverOptions
	slot    chan struct{} // holds a token while a save is in flight
	closing chan struct{} // closed by Close

	mu         sync.Mutex
	engine     aio.Engine
	engineOpts aio.Options   // the options engine was made with
	pool       *buffers.Pool // snapshot chunks
	bounce     *buffers.Pool // store tensors while draining
	cur        *Handle
	closed     bool
}

// NewSaver returns a Saver. Its engine and pools are made on first use.
func NewSaver(opts SaverOptions) *Saver {
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	return &Saver{opts: opts, slot: make(chan struct{}, 1), closing: make(chan struct{})}
}

// Handle is one asynchronous save.
type Handle struct {
	dir      string
	done     chan struct{}
	m        *Manifest
	err      error
	snapshot time.Duration
	bytes    int64
}

// Done is closed when the save has finished, committed or failed.
func (h *Handle) Done() <-chan struct{} { return h.done }

// Wait blocks until the save has finished and returns its manifest (the
// checkpoint is committed and durable) or the error that stopped it (then
// nothing was committed and the temporary directory is removed).
func (h *Handle) Wait() (*Manifest, error) {
	<-h.done
	return h.m, h.err
}

// Dir is the checkpoint directory being written.
func (h *Handle) Dir() string { return h.dir }

// SnapshotDuration is how long SaveAsync took to copy the state, i.e. how
// long the training loop was held.
func (h *Handle) SnapshotDuration() time.Duration { return h.snapshot }

// SnapshotBytes is the pinned memory the snapshot holds at its start.
func (h *Handle) SnapshotBytes() int64 { return h.bytes }

// InFlight reports whether a save is still draining.
func (s *Saver) InFlight() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cur == nil {
		return false
	}
	select {
	case <-s.cur.done:
		return false
	default:
		return true
	}
}

// Close waits for the save in flight, then frees the Saver's pinned memory
// and engine.
func (s *Saver) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	close(s.closing)
	s.mu.Unlock()
	s.slot <- struct{}{} // the in-flight save, if any, gives it back when done
	s.mu.Lock()
	defer s.mu.Unlock()
	var errs []error
	for _, p := range []*buffers.Pool{s.pool, s.bounce} {
		if p != nil {
			errs = append(errs, p.Close())
		}
	}
	if s.engine != nil {
		errs = append(errs, s.engine.Close())
	}
	return errors.Join(errs...)
}

// snapFile is one file's place in the snapshot stream.
type snapFile struct {
	pf     *plannedFile
	f      *aio.File
	start  int64 // stream offset of the file's byte 0
	padded int64 // length rounded up to the alignment
}

// SaveAsync takes a snapshot of state and returns a Handle while the
// snapshot is written to the checkpoint dir in the background, exactly as
// Save would write it (same layout, same commit, same KeepLast). When it
// returns, the tensors' sources may change: the checkpoint holds the bytes
// they had during SaveAsync. Store tensors' versions and FromPinned
// tensors' bytes are pinned during SaveAsync for the same reason (see
// Saver), and released when the save has finished (committed or failed).
//
// ctx governs the whole save, background included: cancelling it aborts
// the save (nothing is committed). Errors found before the snapshot is
// taken (invalid state, an existing checkpoint, no memory) are returned
// here; later ones by Handle.Wait.
func (s *Saver) SaveAsync(ctx context.Context, dir string, state State, opts SaveOptions) (*Handle, error) {
	root, name, p, err := prepareSave(dir, &state, &opts)
	if err != nil {
		return nil, err
	}
	select {
	case <-s.closing:
		return nil, &Error{Op: "save", Path: dir, Err: ErrClosed}
	default:
	}
	select {
	case s.slot <- struct{}{}:
	case <-s.closing:
		return nil, &Error{Op: "save", Path: dir, Err: ErrClosed}
	case <-ctx.Done():
		return nil, &Error{Op: "save", Path: dir, Err: fmt.Errorf("%w: %w", ErrSaveInFlight, ctx.Err())}
	}
	h, err := s.start(ctx, root, name, p, opts)
	if err != nil {
		<-s.slot
		return nil, err
	}
	return h, nil
}

// start runs with the slot held; on success the background goroutine
// gives it back.
func (s *Saver) start(ctx context.Context, root, name string, p *plan, opts SaveOptions) (*Handle, error) {
	t0 := time.Now()
	dir := filepath.Join(root, name)
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil, &Error{Op: "save", Path: dir, Err: ErrClosed}
	}
	eng := opts.Engine
	if eng == nil {
		// The slot is held: the previous save has finished with the engine.
		var err error
		eo := opts
		eo.Logger = s.opts.Logger
		if eng, err = ownEngine(&s.engine, &s.engineOpts, eo); err != nil {
			s.mu.Unlock()
			return nil, &Error{Op: "save", Path: dir, Err: err}
		}
	}
	s.mu.Unlock()

	// Stale directories are cleaned in the background, before the commit.
	tx, err := begin(root, name, opts.Overwrite, opts.Logger)
	if err != nil {
		return nil, err
	}
	files, align, err := openFiles(eng, tx.tmp, p)
	fail := func(err error) (*Handle, error) {
		closeFiles(files)
		tx.abort()
		return nil, err
	}
	if err != nil {
		return fail(err)
	}
	chunk := int64(opts.StagingBytes)
	align = max(align, 4096)
	if chunk%align != 0 {
		return fail(&Error{Op: "save", Path: tx.tmp, Err: invalidf("StagingBytes %d is not a multiple of the O_DIRECT alignment %d", chunk, align)})
	}
	// Lay the files out back to back, each at an aligned stream offset, so
	// every write is aligned and comes straight from the snapshot.
	sf := make([]snapFile, len(p.files))
	var pos int64
	for i, pf := range p.files {
		sf[i] = snapFile{pf: pf, f: files[i], start: pos, padded: roundUp(pf.length, align)}
		pos += sf[i].padded
	}
	nChunks := (pos + chunk - 1) / chunk
	need := nChunks * chunk
	if s.opts.MaxSnapshotBytes > 0 && need > s.opts.MaxSnapshotBytes {
		return fail(&Error{Op: "save", Path: dir, Err: fmt.Errorf("%w: %d bytes needed (%d of checkpoint in %d chunks of %d), MaxSnapshotBytes is %d",
			ErrSnapshotTooLarge, need, p.total, nChunks, chunk, s.opts.MaxSnapshotBytes)})
	}
	s.mu.Lock()
	// Every chunk takes a power-of-two block of the buddy allocator, so
	// nChunks such blocks always fit without fragmentation.
	pool, err := growPool(&s.pool, nChunks*int64(ceilPow2(uint64(chunk))), int(align), chunk, s.opts.Logger)
	var bounce *buffers.Pool
	if err == nil {
		bounce, err = storeBouncePool(&s.bounce, p, opts)
	}
	if err == nil && eng == s.engine {
		registerPools(eng, pool, bounce)
	}
	s.mu.Unlock()
	if err != nil {
		return fail(&Error{Op: "save", Path: dir, Err: err})
	}
	chunks := make([]*buffers.Buffer, nChunks)
	refs := make([]atomic.Int32, nChunks)
	releaseAll := func() {
		for i, c := range chunks {
			if c != nil && refs[i].Load() > 0 {
				c.Release()
			}
		}
	}
	for i := range chunks {
		// The pool is the Saver's own and the previous save has finished,
		// so all of it is free: never block here.
		b, ok := pool.TryAcquire(int(chunk), buffers.PurposeCheckpoint)
		if !ok {
			releaseAll()
			return fail(&Error{Op: "save", Path: dir, Err: fmt.Errorf("checkpoint: internal error: snapshot chunk %d of %d not available from a pool of %d bytes", i, nChunks, pool.CapacityBytes())})
		}
		chunks[i] = b
		refs[i].Store(1) // dropped below once the files' references are counted
	}
	for _, f := range sf {
		for c := f.start / chunk; c*chunk < f.start+f.padded; c++ {
			refs[c].Add(1)
		}
	}
	// Store tensors are not copied: their current versions are pinned (the
	// store is copy-on-write, so training's later writes go elsewhere) and
	// the drain reads them from there.
	pins, err := pinStores(p)
	var pinned map[*Tensor][][]byte
	unpinTensors := func() {}
	if err == nil {
		// Likewise FromPinned tensors: their sources hold their bytes
		// still until the drain has read them.
		if pinned, unpinTensors, err = pinTensors(ctx, p); err != nil {
			unpin(pins)
		}
	}
	if err != nil {
		releaseAll()
		var ce *Error
		if !errors.As(err, &ce) {
			err = &Error{Op: "save", Path: dir, Err: err}
		}
		return fail(err)
	}
	drainCtx, cancelDrain := context.WithCancel(ctx)
	snapOK := make(chan bool, 1)    // the copy's outcome, for the background
	snapDone := make(chan struct{}) // closed once the copy succeeded: the drain starts
	drained := make(chan struct{})
	h := &Handle{dir: dir, done: make(chan struct{}), bytes: need}
	go func() {
		derr := s.drain(drainCtx, eng, tx, sf, chunks, refs, chunk, snapDone, bounce, pins, pinned, opts)
		unpin(pins)
		unpinTensors()
		if !<-snapOK {
			close(drained) // start cleans up and returns the copy's error
			return
		}
		defer func() { <-s.slot }()
		defer close(h.done)
		defer cancelDrain()
		if derr == nil {
			h.m, h.err = s.finish(ctx, tx, p, opts)
		} else {
			h.err = derr
		}
		releaseAll()
		closeFiles(files)
		if h.err != nil {
			tx.abort()
		}
	}()

	// Copy: each file's bytes into its stream range, Parallel files at once.
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(opts.Parallel)
	for i := range sf {
		f := &sf[i]
		g.Go(func() error {
			fl := newFiller(f.pf, bounce)
			fl.noCRC = true     // the drain computes them from the snapshot
			fl.skipStore = true // store and FromPinned tensors are pinned: the drain reads them
			defer fl.close()
			return forSegments(chunks, chunk, f.start, f.start+f.padded, func(seg []byte, lo int64) error {
				if err := gctx.Err(); err != nil {
					return err
				}
				fileOff := lo - f.start
				n := min(int64(len(seg)), max(0, f.pf.length-fileOff))
				if err := fl.fill(gctx, seg[:n]); err != nil {
					return err
				}
				clear(seg[n:]) // alignment padding
				return nil
			})
		})
	}
	if err := g.Wait(); err != nil {
		cancelDrain()
		snapOK <- false
		<-drained // nothing in flight any more
		releaseAll()
		var ce *Error
		if !errors.As(err, &ce) {
			err = &Error{Op: "save", Path: dir, Err: err}
		}
		return fail(err)
	}
	h.snapshot = time.Since(t0)
	close(snapDone)
	for i := range chunks {
		if refs[i].Add(-1) == 0 {
			chunks[i].Release() // every write from it is already done
		}
	}
	s.mu.Lock()
	s.cur = h
	s.mu.Unlock()
	snapOK <- true
	return h, nil
}

// forSegments calls fn for each piece of stream range [lo, hi) that lies
// in one chunk, in order, with the piece's stream offset.
func forSegments(chunks []*buffers.Buffer, chunk, lo, hi int64, fn func(seg []byte, lo int64) error) error {
	for pos := lo; pos < hi; {
		c := pos / chunk
		end := min(hi, (c+1)*chunk)
		mem := chunks[c].Bytes()
		if err := fn(mem[pos-c*chunk:end-c*chunk], pos); err != nil {
			return err
		}
		pos = end
	}
	return nil
}

// drain writes the snapshot once it is taken (snapDone): each file's
// segments in order, up to StagingBuffers requests in flight per file,
// Parallel files at once; each chunk is released once every write from it
// is done. Pinned store tensors are read into their segments, and every
// tensor's CRC-32C is computed from the snapshot, just before the segment
// is written. Each file is then truncated to its length, fdatasync'ed and
// closed.
//
// Nothing is written, and no checksum computed, while the snapshot is
// being copied: that copy holds the caller, and on a machine with few
// cores the writes' submission (the kernel pins each request's pages) and
// CRC-32C (about half the speed of memcpy) slow it down. Measured on 2
// cores with a 4 GiB checkpoint: SaveAsync held the caller 0.7 s with
// checksums taken during the copy, 0.35 s with them put off, 0.22 s with
// the writes held back too, and the save was not slower to commit.
func (s *Saver) drain(ctx context.Context, eng aio.Engine, tx *txn, sf []snapFile,
	chunks []*buffers.Buffer, refs []atomic.Int32, chunk int64, snapDone <-chan struct{},
	bounce *buffers.Pool, pins map[*swapper.Store]*swapper.Pinned, pinned map[*Tensor][][]byte, opts SaveOptions) error {
	select {
	case <-snapDone:
	case <-ctx.Done():
		return ctx.Err() // the copy failed: start cleans up
	}
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(opts.Parallel)
	for i := range sf {
		f := &sf[i]
		g.Go(func() error {
			path := filepath.Join(tx.tmp, f.pf.relPath)
			n := opts.StagingBuffers
			reqs := make([]aio.Request, n)
			chunkOf := make([]int64, n)
			busy := make([]bool, n)
			wait := func(i int) error {
				if !busy[i] {
					return nil
				}
				busy[i] = false
				_, err := reqs[i].Wait()
				if refs[chunkOf[i]].Add(-1) == 0 {
					chunks[chunkOf[i]].Release()
				}
				return err
			}
			crc := crcTracker{f: f.pf}
			// The pinned store and FromPinned tensors' bytes go into the
			// snapshot here, just before their segment is written.
			var holes *filler
			if f.pf.hasDeferred() {
				holes = newFiller(f.pf, bounce)
				holes.noCRC, holes.storeOnly, holes.pins, holes.pinned = true, true, pins, pinned
				defer holes.close()
			}
			k := 0
			err := forSegments(chunks, chunk, f.start, f.start+f.padded, func(seg []byte, lo int64) error {
				i := k % n
				k++
				if err := wait(i); err != nil {
					return err
				}
				if err := gctx.Err(); err != nil {
					return err
				}
				fileOff := lo - f.start
				if holes != nil {
					if err := holes.fill(gctx, seg[:min(int64(len(seg)), max(0, f.pf.length-fileOff))]); err != nil {
						return err
					}
				}
				crc.feed(seg, fileOff)
				if uintptr(unsafe.Pointer(&seg[0]))%uintptr(f.f.Alignment()) != 0 {
					return fmt.Errorf("snapshot chunk not aligned to %d", f.f.Alignment())
				}
				r := &reqs[i]
				r.Op, r.File, r.Offset, r.Buf = aio.OpWrite, f.f, fileOff, seg
				if err := eng.Submit(r); err != nil {
					return err
				}
				chunkOf[i] = lo / chunk
				busy[i] = true
				return nil
			})
			for i := range reqs {
				if werr := wait(i); werr != nil && err == nil {
					err = werr
				}
			}
			if err != nil {
				var ce *Error
				if errors.As(err, &ce) {
					return err
				}
				return &Error{Op: "save", Path: path, Err: err}
			}
			crc.finish()
			return finishFile(f.f, f.pf, path, f.padded)
		})
	}
	return g.Wait()
}

// finish writes the manifests, cleans stale directories and commits.
func (s *Saver) finish(ctx context.Context, tx *txn, p *plan, opts SaveOptions) (*Manifest, error) {
	m, err := writeManifests(tx.tmp, p)
	if err != nil {
		return nil, err
	}
	cleanStale(tx.root, opts.Logger)
	if err := ctx.Err(); err != nil {
		return nil, &Error{Op: "save", Path: tx.final, Err: err}
	}
	if err := tx.commit(); err != nil {
		return nil, err
	}
	m.Dir = tx.final
	retain(tx.root, tx.name, opts.KeepLast, opts.RetainMatch, opts.Logger)
	return m, nil
}

package checkpoint

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"unsafe"

	"golang.org/x/sync/errgroup"

	"github.com/zinfio/zinf/aio"
	"github.com/zinfio/zinf/buffers"
	"github.com/zinfio/zinf/internal/base/crc32c"
	"github.com/zinfio/zinf/internal/base/testhook"
)

// Writer saves checkpoints synchronously. It keeps its I/O engine and
// pinned staging memory between saves, so a training job that checkpoints
// every N steps maps and pins them once. A Writer runs one Save at a time
// (concurrent calls wait); Close is called once, after the last Save.
type Writer struct {
	mu         sync.Mutex
	engine     aio.Engine  // own engine, made on first use
	engineOpts aio.Options // the options it was made with
	staging    *buffers.Pool
	bounce     *buffers.Pool
	closed     bool
}

// NewWriter returns a Writer. Its engine and pools are made on first use.
func NewWriter() *Writer { return &Writer{} }

// Close releases the Writer's engine and pinned memory.
func (w *Writer) Close() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		return nil
	}
	w.closed = true
	var errs []error
	for _, p := range []*buffers.Pool{w.staging, w.bounce} {
		if p != nil {
			errs = append(errs, p.Close())
		}
	}
	if w.engine != nil {
		errs = append(errs, w.engine.Close())
	}
	return errors.Join(errs...)
}

// Save writes state as the checkpoint dir (<root>/<name>) with a Writer
// made for this one call (see Writer.Save).
func Save(ctx context.Context, dir string, state State, opts SaveOptions) (*Manifest, error) {
	w := NewWriter()
	m, err := w.Save(ctx, dir, state, opts)
	if cerr := w.Close(); err == nil && cerr != nil {
		return m, cerr
	}
	return m, err
}

// Save writes state as the checkpoint dir, i.e. <root>/<name> with root =
// filepath.Dir(dir) (created if missing), and returns its manifest once it
// is committed and durable.
//
// Each safetensors file streams through StagingBuffers pinned buffers of
// StagingBytes into O_DIRECT writes (the last one padded to the alignment,
// then the file truncated to its true length), Parallel files at a time,
// each fdatasync'ed. The files, the rank manifests and checkpoint.json go
// into a temporary directory <root>/.tmp-zinf-ckpt-<name>-<random>, which is fsync'ed
// and renamed to <root>/<name>; the root is fsync'ed last. Until that
// rename nothing of the new checkpoint is visible under its name, so a
// crash at any point leaves the previous checkpoints as they were.
//
// Before writing, the temporary directories of this package's writers
// that died are removed from root, and nothing else (see the package
// documentation); after committing, KeepLast
// applies. A failed save removes its temporary directory and returns an
// *Error that says what failed. The tensors' sources must not change
// until Save returns.
func (w *Writer) Save(ctx context.Context, dir string, state State, opts SaveOptions) (*Manifest, error) {
	root, name, p, err := prepareSave(dir, &state, &opts)
	if err != nil {
		return nil, err
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	eng, err := w.engineFor(dir, opts)
	if err != nil {
		return nil, err
	}
	cleanStale(root, opts.Logger)
	tx, err := begin(root, name, opts.Overwrite, opts.Logger)
	if err != nil {
		return nil, err
	}
	defer tx.abort()
	if err := w.writeFiles(ctx, dir, eng, tx.tmp, p, opts); err != nil {
		return nil, err
	}
	m, err := writeManifests(tx.tmp, p)
	if err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, &Error{Op: "save", Path: dir, Err: err}
	}
	if err := tx.commit(); err != nil {
		return nil, err
	}
	m.Dir = tx.final
	retain(root, name, opts.KeepLast, opts.RetainMatch, opts.Logger)
	return m, nil
}

// engineFor returns the engine a save uses: SaveOptions.Engine, or the
// Writer's own (made on first use). w.mu is held.
func (w *Writer) engineFor(dir string, opts SaveOptions) (aio.Engine, error) {
	if w.closed {
		return nil, &Error{Op: "save", Path: dir, Err: ErrClosed}
	}
	if opts.Engine != nil {
		return opts.Engine, nil
	}
	eng, err := ownEngine(&w.engine, &w.engineOpts, opts)
	if err != nil {
		return nil, &Error{Op: "save", Path: dir, Err: err}
	}
	return eng, nil
}

// writeFiles creates the plan's rank directories and files in tmp and
// streams every file, Parallel at a time. w.mu is held.
func (w *Writer) writeFiles(ctx context.Context, dir string, eng aio.Engine, tmp string, p *plan, opts SaveOptions) error {
	files, align, err := openFiles(eng, tmp, p)
	defer closeFiles(files)
	if err != nil {
		return err
	}
	if int64(opts.StagingBytes)%align != 0 {
		return &Error{Op: "save", Path: tmp, Err: invalidf("StagingBytes %d is not a multiple of the O_DIRECT alignment %d", opts.StagingBytes, align)}
	}
	staging := opts.Pool
	if staging == nil {
		per := int64(ceilPow2(uint64(opts.stagingPerFile())))
		if staging, err = growPool(&w.staging, int64(max(1, min(opts.Parallel, len(p.files))))*per, int(align), opts.stagingPerFile(), opts.Logger); err != nil {
			return &Error{Op: "save", Path: dir, Err: err}
		}
	} else if int64(staging.MinBufferBytes())%align != 0 {
		return &Error{Op: "save", Path: dir, Err: invalidf("SaveOptions.Pool has MinBufferBytes %d, not a multiple of the O_DIRECT alignment %d", staging.MinBufferBytes(), align)}
	}
	bounce, err := w.bouncePool(p, opts)
	if err != nil {
		return &Error{Op: "save", Path: dir, Err: err}
	}
	if eng == w.engine {
		// The Writer's own pools (never a caller's) with its own engine.
		registerPools(eng, w.staging, w.bounce)
	}
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(opts.Parallel)
	for i, pf := range p.files {
		g.Go(func() error {
			return streamFile(gctx, eng, staging, bounce, files[i], pf, tmp, opts)
		})
	}
	return g.Wait()
}

// ownEngine returns *e, made (or, when opts need another shape, remade:
// no save of its owner is in flight) with WriterEngineOptions(opts); *eo
// records the options it was made with.
func ownEngine(e *aio.Engine, eo *aio.Options, opts SaveOptions) (aio.Engine, error) {
	want := WriterEngineOptions(opts)
	if *e != nil && !sameEngineShape(*eo, want) {
		// Pools registered with it stay in its (closed) set; they
		// unregister from it harmlessly when they are unmapped.
		if err := (*e).Close(); err != nil {
			opts.Logger.Warn("checkpoint: closing the engine of another shape failed", "err", err)
		}
		*e = nil
	}
	if *e == nil {
		ne, err := newWriteEngine(opts)
		if err != nil {
			return nil, err
		}
		*e, *eo = ne, want
	}
	return *e, nil
}

// bouncePool returns pinned memory for FromStore tensors: one of the
// largest per file written at once (nil when the plan has none). Each
// writer holds at most one, so the pool can always serve the next.
func (w *Writer) bouncePool(p *plan, opts SaveOptions) (*buffers.Pool, error) {
	return storeBouncePool(&w.bounce, p, opts)
}

func storeBouncePool(pp **buffers.Pool, p *plan, opts SaveOptions) (*buffers.Pool, error) {
	if p.maxStorePadded == 0 {
		return nil, nil
	}
	var align int64 = 4096
	for _, pf := range p.files {
		for _, pt := range pf.tensors {
			if pt.t.store != nil {
				align = max(align, pt.t.store.Alignment())
			}
		}
	}
	per := int64(ceilPow2(uint64(roundUp(p.maxStorePadded, align))))
	return growPool(pp, int64(opts.Parallel)*per, int(align), p.maxStorePadded, opts.Logger)
}

// splitDir splits a checkpoint directory into its root and name.
func splitDir(dir string) (root, name string, err error) {
	clean := filepath.Clean(dir)
	root, name = filepath.Dir(clean), filepath.Base(clean)
	if name == "." || name == ".." || name == string(filepath.Separator) || strings.HasPrefix(name, ".") {
		return "", "", &Error{Op: "save", Path: dir, Err: invalidf("checkpoint directory name %q must be a plain name not starting with a dot (e.g. step-000100)", name)}
	}
	return root, name, nil
}

// openFiles creates the rank directories and every file of the plan, and
// returns the largest O_DIRECT alignment among them.
func openFiles(eng aio.Engine, tmp string, p *plan) ([]*aio.File, int64, error) {
	for _, r := range p.present {
		if err := os.Mkdir(filepath.Join(tmp, rankDirName(r)), 0o755); err != nil {
			return nil, 0, &Error{Op: "save", Path: tmp, Err: err}
		}
	}
	files := make([]*aio.File, 0, len(p.files))
	var align int64 = 1
	for _, pf := range p.files {
		path := filepath.Join(tmp, pf.relPath)
		f, err := eng.Open(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
		if err != nil {
			return files, 0, &Error{Op: "save", Path: path, Err: err}
		}
		files = append(files, f)
		a := int64(f.Alignment())
		if a&(a-1) != 0 {
			return files, 0, &Error{Op: "save", Path: path, Err: fmt.Errorf("O_DIRECT alignment %d is not a power of two", a)}
		}
		align = max(align, a)
	}
	return files, align, nil
}

func closeFiles(files []*aio.File) {
	for _, f := range files {
		if f != nil {
			f.Close()
		}
	}
}

// streamFile writes one planned file through a ring of staging slots: fill
// slot k%N (waiting for its previous write first), submit it, move on; the
// device works on up to N slots while the next is filled. The tail is
// padded to the alignment and the file truncated to its length afterwards;
// then it is fdatasync'ed.
func streamFile(ctx context.Context, eng aio.Engine, staging, bounce *buffers.Pool, f *aio.File, pf *plannedFile, tmp string, opts SaveOptions) (err error) {
	path := filepath.Join(tmp, pf.relPath)
	fail := func(e error) error {
		var ce *Error
		if errors.As(e, &ce) {
			return e
		}
		return &Error{Op: "save", Path: path, Err: e}
	}
	align := int64(f.Alignment())
	n := opts.StagingBuffers
	s := int64(opts.StagingBytes)
	buf, err := staging.Acquire(ctx, int(opts.stagingPerFile()), buffers.PurposeCheckpoint)
	if err != nil {
		return fail(err)
	}
	defer buf.Release()
	mem := buf.Bytes()
	if uintptr(unsafe.Pointer(&mem[0]))%uintptr(align) != 0 {
		return fail(fmt.Errorf("staging buffer not aligned to %d", align))
	}
	reqs := make([]aio.Request, n)
	busy := make([]bool, n)
	wait := func(i int) error {
		if !busy[i] {
			return nil
		}
		busy[i] = false
		_, err := reqs[i].Wait()
		return err
	}
	fl := newFiller(pf, bounce)
	defer fl.close()
	var werr error
	for k, pos := 0, int64(0); pos < pf.length; k++ {
		i := k % n
		if werr = wait(i); werr != nil {
			break
		}
		if werr = ctx.Err(); werr != nil {
			break
		}
		m := min(s, pf.length-pos)
		slot := mem[int64(i)*s : int64(i+1)*s]
		if werr = fl.fill(ctx, slot[:m]); werr != nil {
			break
		}
		wl := roundUp(m, align)
		clear(slot[m:wl])
		r := &reqs[i]
		r.Op, r.File, r.Offset, r.Buf = aio.OpWrite, f, pos, slot[:wl]
		if werr = eng.Submit(r); werr != nil {
			break
		}
		busy[i] = true
		pos += m
	}
	// Nothing may stay in flight on buf: wait for every slot.
	for i := range reqs {
		if err := wait(i); err != nil && werr == nil {
			werr = err
		}
	}
	if werr != nil {
		return fail(werr)
	}
	return finishFile(f, pf, path, roundUp(pf.length, align))
}

// finishFile truncates away the alignment padding (written is the length
// the writes reached), fdatasyncs and closes. The fdatasync covers the size
// change, which is needed to read the data back.
func finishFile(f *aio.File, pf *plannedFile, path string, written int64) error {
	testhook.Hit("checkpoint/file-written")
	if written != pf.length {
		if err := f.Truncate(pf.length); err != nil {
			return &Error{Op: "save", Path: path, Err: err}
		}
	}
	if err := f.Sync(); err != nil {
		return &Error{Op: "save", Path: path, Err: err}
	}
	if err := f.Close(); err != nil {
		return &Error{Op: "save", Path: path, Err: err}
	}
	return nil
}

// writeManifests writes each rank's manifest.json (fsync'ed, with its
// directory) and then checkpoint.json (fsync'ed); the caller commits.
func writeManifests(tmp string, p *plan) (*Manifest, error) {
	entries, rms, err := writeRankManifests(tmp, p)
	if err != nil {
		return nil, err
	}
	return writeIndex(tmp, p, entries, rms)
}

// writeRankManifests writes the manifest.json of each rank the plan holds
// (fsync'ed, with its directory) and returns their index entries.
func writeRankManifests(tmp string, p *plan) ([]RankEntry, []*RankManifest, error) {
	st := p.state
	byRank := make([]*RankState, st.world())
	for i := range st.Ranks {
		byRank[st.Ranks[i].Rank] = &st.Ranks[i]
	}
	var entries []RankEntry
	var rms []*RankManifest
	for _, r := range p.present {
		files := p.ranks[r]
		rm := &RankManifest{
			Format: FormatName, Version: FormatVersion, Name: p.name, Step: st.Step,
			Rank: r, WorldSize: st.world(), Created: p.created, Config: rawConfig(st.Config),
			ModelShape: st.ModelShape, User: mergeUser(st.User, byRank[r].User),
			Files: []FileEntry{}, Tensors: []TensorEntry{},
		}
		var tensorBytes int64
		for _, pf := range files {
			rm.Files = append(rm.Files, FileEntry{
				Name: pf.name, Bytes: pf.length, HeaderBytes: int64(len(pf.header)),
				HeaderCRC32C: crc32c.Checksum(pf.header),
			})
			for _, pt := range pf.tensors {
				rm.Tensors = append(rm.Tensors, TensorEntry{
					Name: pt.t.Name, File: pf.name, DType: pt.t.DType.SafetensorsName(),
					Shape: cloneShape(pt.t.Shape), Offset: pt.offset, Bytes: pt.t.Bytes, CRC32C: pt.crc,
				})
				tensorBytes += pt.t.Bytes
			}
		}
		rdir := filepath.Join(tmp, rankDirName(r))
		b, err := writeJSONFile(filepath.Join(rdir, manifestFile), rm)
		if err != nil {
			return nil, nil, &Error{Op: "save", Path: rdir, Err: fmt.Errorf("writing the manifest: %w", err)}
		}
		if err := syncDir(rdir); err != nil {
			return nil, nil, &Error{Op: "save", Path: rdir, Err: err}
		}
		entries = append(entries, RankEntry{
			Rank: r, Dir: rankDirName(r), ManifestBytes: int64(len(b)), ManifestCRC32C: crc32c.Checksum(b),
			Files: len(rm.Files), Tensors: len(rm.Tensors), TensorBytes: tensorBytes,
		})
		rms = append(rms, rm)
	}
	return entries, rms, nil
}

// writeIndex writes checkpoint.json (fsync'ed) listing entries, every
// rank of the world in rank order.
func writeIndex(tmp string, p *plan, entries []RankEntry, rms []*RankManifest) (*Manifest, error) {
	st := p.state
	idx := &Manifest{
		Format: FormatName, Version: FormatVersion, Name: p.name, Step: st.Step,
		WorldSize: st.world(), Created: p.created, Config: rawConfig(st.Config),
		ModelShape: st.ModelShape, User: st.User, Ranks: entries, RankManifests: rms,
	}
	if _, err := writeJSONFile(filepath.Join(tmp, indexFile), idx); err != nil {
		return nil, &Error{Op: "save", Path: tmp, Err: fmt.Errorf("writing %s: %w", indexFile, err)}
	}
	return idx, nil
}

func rawConfig(b []byte) []byte {
	if len(b) == 0 {
		return nil
	}
	return append([]byte(nil), b...)
}

// prepareSave is what Save and SaveAsync check and compute before writing:
// the options (defaults filled), the state, the target's root and name,
// and the file plan. Errors name the directory.
func prepareSave(dir string, state *State, opts *SaveOptions) (root, name string, p *plan, err error) {
	opts.EnsureDefaults()
	if err := opts.Validate(); err != nil {
		return "", "", nil, &Error{Op: "save", Path: dir, Err: err}
	}
	if err := state.validate(); err != nil {
		return "", "", nil, &Error{Op: "save", Path: dir, Err: err}
	}
	if root, name, err = splitDir(dir); err != nil {
		return "", "", nil, err
	}
	if p, err = makePlan(name, state); err != nil {
		return "", "", nil, &Error{Op: "save", Path: dir, Err: err}
	}
	return root, name, p, nil
}

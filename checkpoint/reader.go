package checkpoint

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/zinfio/zinf/aio"
	"github.com/zinfio/zinf/buffers"
	"github.com/zinfio/zinf/internal/base/crc32c"
)

// Reader reads one rank of a committed checkpoint. Open checks the
// checkpoint's structure (format, version, manifests, that every file is
// there with its exact size); ReadTensor checks each tensor's bytes
// against its CRC-32C. Methods are safe for concurrent use; Close is
// called once, after the last read.
type Reader struct {
	dir     string // checkpoint directory
	rankDir string
	idx     *Manifest
	m       *RankManifest
	byName  map[string]*TensorEntry
	files   map[string]*FileEntry
	opts    ReadOptions

	mu        sync.Mutex
	engine    aio.Engine
	ownEngine bool
	pool      *buffers.Pool
	open      map[string]*openFile
	closed    bool
}

// openFile is one tensor file opened for reading.
type openFile struct {
	path     string
	entry    *FileEntry
	direct   *aio.File // per the engine's O_DIRECT policy
	buffered *aio.File // for the unaligned tail of an O_DIRECT file
	align    int64

	mu        sync.Mutex
	checked   bool  // the header check ran to completion
	headerErr error // its outcome
}

// Meta is a rank's metadata (Reader.Meta).
type Meta struct {
	Name       string // checkpoint name (directory base name)
	Dir        string // checkpoint directory
	RankDir    string // this rank's directory
	Step       int64
	Rank       int
	WorldSize  int
	Created    time.Time
	Config     json.RawMessage
	ModelShape map[string][]int64
	User       map[string]string
}

// Open opens a checkpoint for reading: dir is either a checkpoint
// directory holding a single rank, or a rank directory (rank-NNNNN) of a
// committed checkpoint. For multi-rank checkpoints use OpenRank or
// ListRanks.
func Open(dir string) (*Reader, error) { return OpenWith(dir, -1, ReadOptions{}) }

// OpenRank opens rank rank of the checkpoint directory dir.
func OpenRank(dir string, rank int) (*Reader, error) { return OpenWith(dir, rank, ReadOptions{}) }

// OpenWith is Open (rank < 0) or OpenRank (rank >= 0) with options.
func OpenWith(dir string, rank int, opts ReadOptions) (*Reader, error) {
	if err := opts.ensureDefaults(); err != nil {
		return nil, &Error{Op: "open", Path: dir, Err: err}
	}
	ckpt, rank, err := resolveRank(dir, rank)
	if err != nil {
		return nil, &Error{Op: "open", Path: dir, Err: err}
	}
	idx, err := readIndex(ckpt)
	if err != nil {
		return nil, &Error{Op: "open", Path: ckpt, Err: err}
	}
	if rank < 0 {
		if idx.WorldSize != 1 {
			return nil, &Error{Op: "open", Path: ckpt, Err: fmt.Errorf("the checkpoint has %d ranks: open one with OpenRank(dir, rank) or a rank directory from ListRanks", idx.WorldSize)}
		}
		rank = 0
	}
	if rank >= idx.WorldSize {
		return nil, &Error{Op: "open", Path: ckpt, Err: fmt.Errorf("rank %d out of range: the checkpoint has %d ranks", rank, idx.WorldSize)}
	}
	m, err := readRankManifest(idx, rank)
	if err != nil {
		return nil, &Error{Op: "open", Path: filepath.Join(ckpt, rankDirName(rank)), Err: err}
	}
	r := &Reader{
		dir: ckpt, rankDir: filepath.Join(ckpt, rankDirName(rank)), idx: idx, m: m, opts: opts,
		byName: make(map[string]*TensorEntry, len(m.Tensors)), files: make(map[string]*FileEntry, len(m.Files)),
		open: make(map[string]*openFile),
	}
	for i := range m.Tensors {
		r.byName[m.Tensors[i].Name] = &m.Tensors[i]
	}
	for i := range m.Files {
		f := &m.Files[i]
		r.files[f.Name] = f
		path := filepath.Join(r.rankDir, f.Name)
		st, err := os.Stat(path)
		if err != nil {
			if errors.Is(err, os.ErrNotExist) {
				return nil, &Error{Op: "open", Path: path, Err: corruptf("tensor file %s of rank %d is missing", f.Name, rank)}
			}
			return nil, &Error{Op: "open", Path: path, Err: corruptf("%v", err)}
		}
		if st.Size() != f.Bytes {
			what := "truncated"
			if st.Size() > f.Bytes {
				what = "longer than written"
			}
			return nil, &Error{Op: "open", Path: path, Err: corruptf("tensor file %s is %s: %d bytes, the manifest says %d", f.Name, what, st.Size(), f.Bytes)}
		}
	}
	if opts.Engine != nil {
		r.engine = opts.Engine
	} else {
		if r.engine, err = newDefaultEngine(opts.Logger); err != nil {
			return nil, &Error{Op: "open", Path: ckpt, Err: err}
		}
		r.ownEngine = true
	}
	return r, nil
}

// resolveRank turns dir (a checkpoint or a rank directory) into the
// checkpoint directory and the rank (-1: not chosen).
func resolveRank(dir string, rank int) (string, int, error) {
	if _, err := os.Stat(filepath.Join(dir, indexFile)); err == nil {
		if err := notTemporary(dir); err != nil {
			return "", 0, err
		}
		return dir, rank, nil
	}
	if _, err := os.Stat(filepath.Join(dir, manifestFile)); err != nil {
		return "", 0, missingIndexError(dir)
	}
	// A rank directory: the checkpoint is its parent, which must be
	// committed (have checkpoint.json).
	b, err := readSmallFile(filepath.Join(dir, manifestFile))
	if err != nil {
		return "", 0, corruptf("reading %s: %v", manifestFile, err)
	}
	if err := checkFormat(b, manifestFile); err != nil {
		return "", 0, err
	}
	var probe struct {
		Rank int `json:"rank"`
	}
	if err := json.Unmarshal(b, &probe); err != nil {
		return "", 0, corruptf("%s: %v", manifestFile, err)
	}
	if rank >= 0 && rank != probe.Rank {
		return "", 0, fmt.Errorf("%s is rank %d, not rank %d", dir, probe.Rank, rank)
	}
	parent := filepath.Dir(filepath.Clean(dir))
	if filepath.Base(filepath.Clean(dir)) != rankDirName(probe.Rank) {
		return "", 0, corruptf("rank %d manifest in a directory named %q, expected %q", probe.Rank, filepath.Base(dir), rankDirName(probe.Rank))
	}
	if _, err := os.Stat(filepath.Join(parent, indexFile)); err != nil {
		return "", 0, corruptf("rank directory of an uncommitted checkpoint: no %s in %s", indexFile, parent)
	}
	if err := notTemporary(parent); err != nil {
		return "", 0, err
	}
	return parent, probe.Rank, nil
}

// notTemporary refuses a save's temporary directory: complete or not, it
// was never committed (its writer may still be running, or died just
// before the rename).
func notTemporary(dir string) error {
	if base := filepath.Base(filepath.Clean(dir)); strings.HasPrefix(base, tmpPrefix) {
		return corruptf("%s is the temporary directory of a save that was not committed", base)
	}
	return nil
}

// RankInfo is one rank of a checkpoint (ListRanks).
type RankInfo struct {
	Rank        int
	Dir         string // the rank directory
	Files       int
	Tensors     int
	TensorBytes int64
}

// ListRanks lists the ranks of the checkpoint directory dir, checking that
// each rank directory is there. Open each with OpenRank(dir, r.Rank) or
// Open(r.Dir).
func ListRanks(dir string) ([]RankInfo, error) {
	idx, err := readIndex(dir)
	if err != nil {
		return nil, &Error{Op: "list-ranks", Path: dir, Err: err}
	}
	out := make([]RankInfo, 0, len(idx.Ranks))
	for _, e := range idx.Ranks {
		rd := filepath.Join(dir, e.Dir)
		if st, err := os.Stat(rd); err != nil || !st.IsDir() {
			return nil, &Error{Op: "list-ranks", Path: dir, Err: corruptf("rank %d directory %s is missing", e.Rank, e.Dir)}
		}
		out = append(out, RankInfo{Rank: e.Rank, Dir: rd, Files: e.Files, Tensors: e.Tensors, TensorBytes: e.TensorBytes})
	}
	return out, nil
}

// Meta returns the rank's metadata: checkpoint name, step, rank, world
// size, config, model shape and user metadata.
func (r *Reader) Meta() Meta {
	return Meta{
		Name: r.m.Name, Dir: r.dir, RankDir: r.rankDir, Step: r.m.Step, Rank: r.m.Rank, WorldSize: r.m.WorldSize,
		Created: r.m.Created, Config: r.m.Config, ModelShape: r.m.ModelShape, User: r.m.User,
	}
}

// Manifest returns the rank's manifest as read (not to be modified).
func (r *Reader) Manifest() *RankManifest { return r.m }

// Names returns the rank's tensor names, sorted.
func (r *Reader) Names() []string {
	out := make([]string, 0, len(r.byName))
	for n := range r.byName {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

// Tensors returns every tensor's description in file layout order.
func (r *Reader) Tensors() []TensorInfo {
	out := make([]TensorInfo, len(r.m.Tensors))
	for i := range r.m.Tensors {
		out[i] = r.m.Tensors[i].info()
	}
	return out
}

// Tensor describes the tensor name, or returns an error wrapping
// ErrNotFound.
func (r *Reader) Tensor(name string) (TensorInfo, error) {
	t, ok := r.byName[name]
	if !ok {
		return TensorInfo{}, &Error{Op: "read", Path: r.rankDir, Tensor: name, Err: ErrNotFound}
	}
	return t.info(), nil
}

// CheckShapes checks that every tensor in expected is in this rank with
// that shape. It returns an error wrapping ErrShape naming the first
// (in sorted name order) tensor that is missing or has another shape.
// Tensors of the checkpoint not in expected are not an error.
func (r *Reader) CheckShapes(expected map[string][]int64) error {
	names := make([]string, 0, len(expected))
	for n := range expected {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		t, ok := r.byName[n]
		if !ok {
			return &Error{Op: "check-shapes", Path: r.rankDir, Tensor: n, Err: fmt.Errorf("%w: the model has this tensor (shape %v), the checkpoint does not", ErrShape, expected[n])}
		}
		if !slices.Equal(t.Shape, expected[n]) {
			return &Error{Op: "check-shapes", Path: r.rankDir, Tensor: n, Err: fmt.Errorf("%w: the checkpoint has shape %v, the model expects %v", ErrShape, t.Shape, expected[n])}
		}
	}
	return nil
}

// CheckModelShape compares the model shape recorded at save time
// (State.ModelShape) with expected, both ways: it returns an error wrapping
// ErrShape naming the first (sorted) parameter that is missing on either
// side or differs.
func (r *Reader) CheckModelShape(expected map[string][]int64) error {
	saved := r.m.ModelShape
	names := make([]string, 0, len(expected)+len(saved))
	for n := range expected {
		names = append(names, n)
	}
	for n := range saved {
		if _, ok := expected[n]; !ok {
			names = append(names, n)
		}
	}
	sort.Strings(names)
	for _, n := range names {
		e, inE := expected[n]
		s, inS := saved[n]
		var err error
		switch {
		case !inS:
			err = fmt.Errorf("%w: the model has parameter of shape %v, the checkpoint's model did not", ErrShape, e)
		case !inE:
			err = fmt.Errorf("%w: the checkpoint's model had this parameter (shape %v), the model does not", ErrShape, s)
		case !slices.Equal(e, s):
			err = fmt.Errorf("%w: the checkpoint's model had shape %v, the model has %v", ErrShape, s, e)
		}
		if err != nil {
			return &Error{Op: "check-shapes", Path: r.dir, Tensor: n, Err: err}
		}
	}
	return nil
}

// CheckHeaders checks the safetensors header of every file holding one of
// the named tensors (every file of the rank when none is named) by the
// rule ReadTensor applies on a file's first use and Verify applies too:
// its CRC-32C is the manifest's and it describes exactly the manifest's
// tensors. It is for a reader that takes the tensors' places from the
// manifest and reads the bytes itself (in place), which ReadTensor's
// check would otherwise never see. A mismatch returns an error wrapping
// ErrCorrupt naming the file, the header and the manifest; a name the
// rank does not hold, one wrapping ErrNotFound.
func (r *Reader) CheckHeaders(ctx context.Context, names ...string) error {
	var files []string
	if len(names) == 0 {
		for i := range r.m.Files {
			files = append(files, r.m.Files[i].Name)
		}
	}
	for _, n := range names {
		t, ok := r.byName[n]
		if !ok {
			return &Error{Op: "read", Path: r.rankDir, Tensor: n, Err: ErrNotFound}
		}
		if !slices.Contains(files, t.File) {
			files = append(files, t.File)
		}
	}
	for _, f := range files {
		if _, err := r.file(ctx, f); err != nil {
			return err
		}
	}
	return nil
}

// ReadTensor reads tensor name into dst, whose length must be the
// tensor's size, and verifies its CRC-32C (and, on a file's first use, the
// checksum of the file's header). A mismatch returns an error wrapping
// ErrCorrupt that names the tensor and the file; dst then holds the bytes
// read, which must not be used.
func (r *Reader) ReadTensor(ctx context.Context, name string, dst []byte) error {
	t, ok := r.byName[name]
	if !ok {
		return &Error{Op: "read", Path: r.rankDir, Tensor: name, Err: ErrNotFound}
	}
	path := filepath.Join(r.rankDir, t.File)
	if int64(len(dst)) != t.Bytes {
		return &Error{Op: "read", Path: path, Tensor: name, Err: invalidf("destination is %d bytes, the tensor %d", len(dst), t.Bytes)}
	}
	of, err := r.file(ctx, t.File)
	if err != nil {
		var ce *Error
		if errors.As(err, &ce) && ce.Tensor == "" {
			ce = &Error{Op: ce.Op, Path: ce.Path, Tensor: name, Err: ce.Err}
			return ce
		}
		return &Error{Op: "read", Path: path, Tensor: name, Err: err}
	}
	var crc uint32
	pos := 0
	err = r.stream(ctx, of, t.Offset, t.Offset+t.Bytes, func(p []byte) error {
		copy(dst[pos:], p)
		crc = crc32c.Update(crc, p)
		pos += len(p)
		return nil
	})
	if err != nil {
		return &Error{Op: "read", Path: path, Tensor: name, Err: err}
	}
	if crc != t.CRC32C {
		return &Error{Op: "read", Path: path, Tensor: name, Err: corruptf("checksum mismatch: the bytes at offset %d..%d have crc32c %08x, the manifest says %08x",
			t.Offset, t.Offset+t.Bytes, crc, t.CRC32C)}
	}
	return nil
}

// file returns the opened file name, checking its header the first time.
func (r *Reader) file(ctx context.Context, name string) (*openFile, error) {
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		return nil, ErrClosed
	}
	of := r.open[name]
	if of == nil {
		e := r.files[name]
		path := filepath.Join(r.rankDir, name)
		d, err := r.engine.Open(path, os.O_RDONLY, 0)
		if err != nil {
			r.mu.Unlock()
			return nil, &Error{Op: "read", Path: path, Err: err}
		}
		of = &openFile{path: path, entry: e, direct: d, align: int64(d.Alignment())}
		if d.Direct() {
			b, err := aio.OpenFile(path, os.O_RDONLY, 0, aio.DirectOff, r.opts.Logger)
			if err != nil {
				d.Close()
				r.mu.Unlock()
				return nil, &Error{Op: "read", Path: path, Err: err}
			}
			of.buffered = b
		}
		r.open[name] = of
	}
	r.mu.Unlock()
	of.mu.Lock()
	defer of.mu.Unlock()
	if !of.checked {
		herr, err := r.checkHeader(ctx, of)
		if err != nil {
			// Not cached: a cancelled context or a transient I/O error
			// must not condemn the file for later reads.
			return nil, &Error{Op: "read", Path: of.path, Err: err}
		}
		of.checked = true
		if herr != nil {
			of.headerErr = &Error{Op: "read", Path: of.path, Err: herr}
		}
	}
	if of.headerErr != nil {
		return nil, of.headerErr
	}
	return of, nil
}

// checkHeader is the one rule for a tensor file's safetensors header,
// which ReadTensor (and so a resume) and Verify both apply: its CRC-32C
// is the manifest's, and it describes exactly the manifest's tensors of
// the file (names, dtypes, shapes, offsets and the file's size). herr,
// wrapping ErrCorrupt, says what is wrong; err is a failure to read it.
// The header's length was bounded (maxHeaderBytes, and the file's real
// size) when the manifest was read.
func (r *Reader) checkHeader(ctx context.Context, of *openFile) (herr, err error) {
	var tensors []*TensorEntry
	for i := range r.m.Tensors {
		if r.m.Tensors[i].File == of.entry.Name {
			tensors = append(tensors, &r.m.Tensors[i])
		}
	}
	// Reading and parsing a header costs a multiple of its size: one
	// longer than the writer could have made for the manifest's tensors is
	// refused unread (a header of a million entries under the format's
	// 100 MB took some 800 MiB).
	if most := headerBound(r.m, tensors); of.entry.HeaderBytes > most {
		return corruptf("the safetensors header of %s is %d bytes, more than the manifest's %d tensors and metadata can take (%d): not a header the writer made",
			of.entry.Name, of.entry.HeaderBytes, len(tensors), most), nil
	}
	hb := make([]byte, 0, of.entry.HeaderBytes)
	if err := r.stream(ctx, of, 0, of.entry.HeaderBytes, func(p []byte) error { hb = append(hb, p...); return nil }); err != nil {
		return nil, err
	}
	if got := crc32c.Checksum(hb); got != of.entry.HeaderCRC32C {
		return corruptf("the safetensors header of %s is damaged: crc32c %08x, the manifest says %08x",
			of.entry.Name, got, of.entry.HeaderCRC32C), nil
	}
	if err := checkHeaderAgainst(hb, of.entry, tensors); err != nil {
		return corruptf("the safetensors header of %s disagrees with the manifest: %v", of.entry.Name, err), nil
	}
	return nil, nil
}

// headerBound is the most bytes encodeHeader writes for tensors and the
// rank's metadata (headerMeta: fixed keys, the checkpoint's name and the
// user metadata the manifest repeats), with every string byte counted as
// an escape's 6 and every number as 20 digits, padding included.
func headerBound(m *RankManifest, tensors []*TensorEntry) int64 {
	const esc = 6
	n := int64(8+64+8) + 256 + esc*int64(len(m.Name))
	for k, v := range m.User {
		n += esc*int64(len("user.")+len(k)+len(v)) + 8
	}
	for _, t := range tensors {
		n += esc*int64(len(t.Name)) + 128 + 21*int64(len(t.Shape))
	}
	return n
}

// bounce returns the Reader's pinned bounce memory (made on first use).
func (r *Reader) bounce(align int64) (*buffers.Pool, int64, error) {
	chunk := roundUp(int64(r.opts.ChunkBytes), align)
	r.mu.Lock()
	defer r.mu.Unlock()
	per := int64(ceilPow2(uint64(2 * chunk)))
	// Two reads (ReadTensor calls or Verify's files) at once; more wait.
	p, err := growPool(&r.pool, 2*per, int(align), 2*chunk, r.opts.Logger)
	return p, chunk, err
}

// stream reads file bytes [lo, hi) in chunks, two reads in flight, and
// calls fn with each chunk's bytes in order. O_DIRECT reads are aligned:
// each starts at an aligned offset and covers whole blocks, the extra
// bytes are skipped; the file's last partial block, which an O_DIRECT read
// cannot reach without running past the end of the file, is read through
// a buffered descriptor.
func (r *Reader) stream(ctx context.Context, of *openFile, lo, hi int64, fn func(p []byte) error) error {
	if lo >= hi {
		return nil
	}
	align := of.align
	pool, chunk, err := r.bounce(max(align, 4096))
	if err != nil {
		return err
	}
	buf, err := pool.Acquire(ctx, int(2*chunk), buffers.PurposeCheckpoint)
	if err != nil {
		return err
	}
	defer buf.Release()
	mem := buf.Bytes()
	size := of.entry.Bytes
	directEnd := size / align * align // O_DIRECT can read up to here
	start := lo / align * align
	end := roundUp(hi, align)

	var reqs [2]aio.Request
	var busy [2]bool
	defer func() {
		for i := range reqs {
			if busy[i] {
				reqs[i].Wait()
			}
		}
	}()
	// Piece k covers [start+k*chunk, min(start+(k+1)*chunk, end)) and
	// lives in slot k%2.
	pieces := (end - start + chunk - 1) / chunk
	piece := func(k int64) (int64, int64) {
		p := start + k*chunk
		return p, min(p+chunk, end)
	}
	submit := func(k int64) error {
		i := k % 2
		p, q := piece(k)
		if dq := min(q, directEnd); dq > p {
			rq := &reqs[i]
			rq.Op, rq.File, rq.Offset, rq.Buf = aio.OpRead, of.direct, p, mem[i*chunk:i*chunk+dq-p]
			if err := r.engine.Submit(rq); err != nil {
				return err
			}
			busy[i] = true
		}
		return nil
	}
	for k := int64(0); k < min(2, pieces); k++ {
		if err := submit(k); err != nil {
			return err
		}
	}
	for k := int64(0); k < pieces; k++ {
		i := k % 2
		p, q := piece(k)
		slot := mem[i*chunk : (i+1)*chunk]
		if busy[i] {
			busy[i] = false
			n, err := reqs[i].Wait()
			if err != nil {
				return err
			}
			if want := min(q, directEnd) - p; n != want {
				return corruptf("short read at offset %d: %d of %d bytes", p, n, want)
			}
		}
		if tq := min(q, size); tq > directEnd {
			// The unaligned tail, past the last whole block: buffered.
			tp := max(p, directEnd)
			tf := of.buffered
			if tf == nil {
				tf = of.direct
			}
			n, err := r.engine.ReadAt(ctx, tf, slot[tp-p:tq-p], tp)
			if err != nil {
				return err
			}
			if int64(n) != tq-tp {
				return corruptf("short read at offset %d: %d of %d bytes", tp, n, tq-tp)
			}
		}
		if err := fn(slot[max(p, lo)-p : min(q, hi)-p]); err != nil {
			return err
		}
		if k+2 < pieces {
			if err := ctx.Err(); err != nil {
				return err
			}
			if err := submit(k + 2); err != nil {
				return err
			}
		}
	}
	return nil
}

// Close closes the files, the engine (if the Reader made it) and frees the
// bounce memory.
func (r *Reader) Close() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return nil
	}
	r.closed = true
	var errs []error
	for _, of := range r.open {
		errs = append(errs, of.direct.Close())
		if of.buffered != nil {
			errs = append(errs, of.buffered.Close())
		}
	}
	if r.pool != nil {
		errs = append(errs, r.pool.Close())
	}
	if r.ownEngine {
		errs = append(errs, r.engine.Close())
	}
	return errors.Join(errs...)
}

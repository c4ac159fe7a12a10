package checkpoint

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"math/bits"
	"path/filepath"
	"strings"
	"unicode/utf8"

	"github.com/zinfio/zinf/buffers"
	"github.com/zinfio/zinf/swapper"
	"github.com/zinfio/zinf/tensor"
)

// Tensor is one named tensor to save: its element type, shape, size and a
// source for its bytes. Tensors are named by the caller; the name is the key
// in the safetensors file and the manifest, unique within a rank.
//
// The bytes come from Read; for a tensor made by FromStore, straight from
// a swapper.Store; for one made by FromPinned, from memory its source
// holds still. A Tensor never holds a copy of the data itself: a
// synchronous Save streams it through the writer's staging buffers, an
// asynchronous SaveAsync copies it once into its pinned snapshot (store
// and pinned tensors: while it drains, from the versions it pinned).
type Tensor struct {
	Name  string
	DType swapper.DType
	// Shape is the tensor's shape; an empty shape is a scalar (one element).
	Shape []int64
	// Bytes is the tensor's length in bytes: the product of Shape times the
	// dtype's size (checked by Save).
	Bytes int64
	// Read fills dst with bytes [off, off+len(dst)) of the tensor. Save
	// calls it for increasing, contiguous ranges from one goroutine per
	// tensor (tensors of different files may be read concurrently); it never
	// asks for a range outside [0, Bytes). The bytes must not change while a
	// synchronous Save runs; SaveAsync needs them unchanged only until it
	// returns.
	Read func(ctx context.Context, dst []byte, off int64) error

	// Set by FromStore and FromStoreRanges: the writer reads each store
	// tensor whole into a pinned buffer once instead of calling Read per
	// chunk, and SaveAsync pins their versions instead of copying them.
	store     *swapper.Store
	ranges    []StoreRange // the tensor's bytes, in order
	storeLens []int64      // the length of each range's store tensor when the Tensor was made
	// Set by FromPinned: the source's pin function.
	pin PinFunc
	err error // a construction error, reported by Save
}

// PinFunc holds a tensor's bytes still for a save and returns them: segs,
// back to back, are the tensor's bytes (Tensor.Bytes in all), and they must
// not change until release is called; after that they may change or go
// away. It is called once per save of the tensor, with the save's context,
// and may be called from any goroutine; release is called exactly once,
// from any goroutine.
type PinFunc func(ctx context.Context) (segs [][]byte, release func(), err error)

// FromPinned returns a Tensor of size bytes whose source is memory that can
// be held still without a copy: copy-on-write buffers such as the param
// swapper's CPU-tier partitions (param.Swapper.Snapshot) or optimizer
// states kept in pinned memory (optimizer.Optimizer.SnapshotStates), whose
// owner writes new values to other buffers while a snapshot holds the old
// ones.
//
// SaveAsync calls pin while it holds the caller (for the consistent
// snapshot) and does not copy the bytes then: it reads them while it
// drains and calls release when the save is done or has failed, so the
// tensor costs it next to nothing, as a store tensor does. Save (and
// Writer.Save) call pin when they reach the tensor and release once its
// bytes are written out. A State holding FromPinned tensors pins nothing
// until it is saved, so it may be built and dropped freely.
//
// The tensor's Read also works (ad-hoc use) but pins, copies and releases
// on every call.
func FromPinned(name string, dtype swapper.DType, shape []int64, size int64, pin PinFunc) Tensor {
	t := Tensor{Name: name, DType: dtype, Shape: cloneShape(shape), Bytes: size, pin: pin}
	if pin == nil {
		t.err = errors.New("nil pin function")
		return t
	}
	t.Read = func(ctx context.Context, dst []byte, off int64) error {
		segs, release, err := t.pinSegs(ctx)
		if err != nil {
			return err
		}
		defer release()
		copySegs(dst, segs, off)
		return nil
	}
	return t
}

// pinSegs pins a FromPinned tensor and checks what its source returned.
func (t *Tensor) pinSegs(ctx context.Context) ([][]byte, func(), error) {
	segs, release, err := t.pin(ctx)
	if err != nil {
		return nil, nil, err
	}
	if release == nil {
		release = func() {}
	}
	var n int64
	for _, s := range segs {
		n += int64(len(s))
	}
	if n != t.Bytes {
		release()
		return nil, nil, fmt.Errorf("the pinned source has %d bytes, the tensor %d", n, t.Bytes)
	}
	return segs, release, nil
}

// copySegs copies bytes [off, off+len(dst)) of segs, taken back to back,
// into dst.
func copySegs(dst []byte, segs [][]byte, off int64) {
	for _, s := range segs {
		if len(dst) == 0 {
			return
		}
		if off >= int64(len(s)) {
			off -= int64(len(s))
			continue
		}
		c := copy(dst, s[off:])
		dst, off = dst[c:], 0
	}
}

// FromBytes returns a Tensor whose bytes are data (not copied: data must
// not change until a synchronous Save returns, or until SaveAsync returns).
func FromBytes(name string, dtype swapper.DType, shape []int64, data []byte) Tensor {
	return Tensor{
		Name: name, DType: dtype, Shape: cloneShape(shape), Bytes: int64(len(data)),
		Read: func(_ context.Context, dst []byte, off int64) error {
			copy(dst, data[off:])
			return nil
		},
	}
}

// FromFunc returns a Tensor of size bytes whose bytes read fills on demand
// (see Tensor.Read), for sources that are neither a byte slice nor a swap
// store: a device copy, a generator, a memory-mapped file.
func FromFunc(name string, dtype swapper.DType, shape []int64, size int64,
	read func(ctx context.Context, dst []byte, off int64) error) Tensor {
	return Tensor{Name: name, DType: dtype, Shape: cloneShape(shape), Bytes: size, Read: read}
}

// FromStore returns a Tensor whose bytes are the current version of the
// tensor name in store, saved under the same name (set the returned
// Tensor's Name to save it under another). It is FromStoreRanges with one
// range covering the whole store tensor.
//
// The store reads whole tensors only (Store.Read wants a buffer of the
// tensor's full length), so the writer reads each store tensor in one piece
// into a pinned buffer outside the Go heap, then streams it from there: a
// store tensor costs its padded length in pinned memory while it is being
// written (one per file written in parallel), never Go heap. A ranged store
// read would remove that cost; see the package documentation.
//
// SaveAsync does not copy store tensors: it pins their current versions
// (swapper.Store.Pin: the store is copy-on-write, so later writes go to new
// extents) and reads them while it drains, so they add nothing to the time
// it holds the caller.
//
// The tensor's Read also works (tests, ad-hoc use) but reads the whole
// tensor into a temporary pinned buffer on every call: slow, never used by
// Save.
func FromStore(store *swapper.Store, name string, dtype swapper.DType, shape []int64) Tensor {
	var n int64
	if store != nil {
		n, _ = store.Len(name)
	}
	return FromStoreRanges(store, name, dtype, shape, []StoreRange{{Name: name, Off: 0, Len: n}})
}

// StoreRange is bytes [Off, Off+Len) of the store tensor Name.
type StoreRange struct {
	Name     string
	Off, Len int64
}

// FromStoreRanges returns a Tensor whose bytes are the given ranges of the
// current versions of store tensors, back to back: for example one of the
// states of an optimizer whose sub-group records interleave them. Each
// store tensor is read whole (see FromStore), once per run of consecutive
// ranges of it. SaveAsync pins the versions (see FromStore).
func FromStoreRanges(store *swapper.Store, name string, dtype swapper.DType, shape []int64, ranges []StoreRange) Tensor {
	t := Tensor{Name: name, DType: dtype, Shape: cloneShape(shape), store: store, ranges: append([]StoreRange(nil), ranges...)}
	if store == nil {
		t.err = errors.New("nil swap store")
		return t
	}
	for _, r := range ranges {
		n, ok := store.Len(r.Name)
		if !ok {
			t.err = fmt.Errorf("tensor %q is not in the swap store: %w", r.Name, swapper.ErrNotFound)
			return t
		}
		if r.Off < 0 || r.Len < 0 || r.Off+r.Len > n {
			t.err = fmt.Errorf("range [%d, %d) of store tensor %q, which has %d bytes", r.Off, r.Off+r.Len, r.Name, n)
			return t
		}
		t.storeLens = append(t.storeLens, n)
		t.Bytes += r.Len
	}
	t.Read = func(ctx context.Context, dst []byte, off int64) error {
		return t.readStoreSlow(ctx, dst, off)
	}
	return t
}

// rangeAt returns the range holding byte off of the tensor and off's
// offset within it.
func (t *Tensor) rangeAt(off int64) (int, int64) {
	for k, r := range t.ranges {
		if off < r.Len {
			return k, off
		}
		off -= r.Len
	}
	return len(t.ranges), off
}

// readStoreSlow is a store tensor's Read: each range's store tensor whole
// into a throw-away pinned buffer, then the bytes out of it.
func (t *Tensor) readStoreSlow(ctx context.Context, dst []byte, off int64) error {
	for len(dst) > 0 {
		k, in := t.rangeAt(off)
		if k == len(t.ranges) {
			return fmt.Errorf("read at %d past the tensor's %d bytes", off, t.Bytes)
		}
		r := t.ranges[k]
		n, err := readStoreRange(ctx, t.store, r.Name, t.storeLens[k], dst[:min(int64(len(dst)), r.Len-in)], r.Off+in)
		if err != nil {
			return err
		}
		dst, off = dst[n:], off+int64(n)
	}
	return nil
}

// readStoreRange reads store tensor storeName (n bytes) whole into a
// throw-away pinned buffer and copies bytes from off into dst.
func readStoreRange(ctx context.Context, store *swapper.Store, storeName string, n int64, dst []byte, off int64) (int, error) {
	padded := store.PaddedLen(n)
	pool, err := buffers.NewPool(buffers.Options{
		CapacityBytes:  int64(ceilPow2(uint64(padded))),
		MinBufferBytes: int(ceilPow2(uint64(max(store.Alignment(), 4096)))),
		Pin:            buffers.PinOff,
	})
	if err != nil {
		return 0, err
	}
	defer pool.Close()
	b, err := pool.Acquire(ctx, int(padded), buffers.PurposeCheckpoint)
	if err != nil {
		return 0, err
	}
	defer b.Release()
	if err := store.Read(ctx, storeName, b.Bytes()[:n]); err != nil {
		return 0, err
	}
	return copy(dst, b.Bytes()[off:n]), nil
}

func cloneShape(s []int64) []int64 {
	if s == nil {
		return []int64{}
	}
	return append([]int64{}, s...)
}

// TensorFile is one safetensors file of a rank: its base name (ending in
// ".safetensors") and the tensors it holds. Within the file, tensors are
// laid out contiguously, 4-byte dtypes first, then 2-byte ones (each group
// in the given order), so every tensor's data is aligned to its element
// size, as the safetensors library itself does.
type TensorFile struct {
	Name    string
	Tensors []Tensor
}

// RankState is what one rank saves: its files. Each rank gets its own
// directory rank-NNNNN with its files and manifest.
type RankState struct {
	Rank  int
	Files []TensorFile
	// User is per-rank metadata, merged over State.User in this rank's
	// manifest (optional).
	User map[string]string
}

// State is everything one checkpoint holds. Ranks simulated in one process
// are saved together: Ranks must hold ranks 0..len(Ranks)-1 exactly once,
// and the world size is len(Ranks).
type State struct {
	// Step is the training step (recorded, and orders checkpoints for
	// Latest and KeepLast).
	Step int64
	// Config is the run's configuration as raw JSON (for example the
	// ds_config.json), stored verbatim; empty is allowed.
	Config []byte
	// ModelShape is the model's full (unpartitioned) parameter shapes,
	// checked on resume by Reader.CheckModelShape; optional.
	ModelShape map[string][]int64
	// User is free-form string metadata (also copied into every
	// safetensors header's __metadata__ with a "user." prefix).
	User map[string]string
	// Ranks are the ranks' files.
	Ranks []RankState
	// WorldSize is the job's number of ranks when Ranks holds only some
	// of them: SaveShared, where each process saves its own rank. 0 means
	// len(Ranks) (every rank is here).
	WorldSize int
}

// world is the job's number of ranks.
func (s *State) world() int {
	if s.WorldSize > 0 {
		return s.WorldSize
	}
	return len(s.Ranks)
}

// Reserved file names inside a rank directory.
const (
	manifestFile = "manifest.json"
	indexFile    = "checkpoint.json"
)

// validate reports every problem with s at once (errors wrapping
// ErrInvalid).
func (s *State) validate() error {
	var errs []string
	bad := func(format string, args ...any) { errs = append(errs, fmt.Sprintf(format, args...)) }
	if len(s.Ranks) == 0 {
		bad("state has no ranks")
	}
	if s.Step < 0 {
		bad("step %d is negative", s.Step)
	}
	if len(s.Config) > 0 && !json.Valid(s.Config) {
		bad("config is not valid JSON (%d bytes)", len(s.Config))
	}
	for name, shape := range s.ModelShape {
		for _, d := range shape {
			if d < 0 {
				bad("model shape of %q has a negative dimension %v", name, shape)
				break
			}
		}
	}
	for k := range s.User {
		if k == "" {
			bad("user metadata has an empty key")
		}
	}
	if s.WorldSize < 0 || (s.WorldSize > 0 && s.WorldSize < len(s.Ranks)) {
		bad("world size %d for %d ranks", s.WorldSize, len(s.Ranks))
	}
	seenRank := make(map[int]bool)
	for ri := range s.Ranks {
		r := &s.Ranks[ri]
		if r.Rank < 0 || r.Rank >= s.world() {
			bad("rank %d out of range: a world of %d ranks, so ranks must be 0..%d", r.Rank, s.world(), s.world()-1)
		} else if seenRank[r.Rank] {
			bad("rank %d given twice", r.Rank)
		}
		seenRank[r.Rank] = true
		seenFile := make(map[string]bool)
		seenTensor := make(map[string]string)
		for fi := range r.Files {
			f := &r.Files[fi]
			if err := checkFileName(f.Name); err != nil {
				bad("rank %d: %v", r.Rank, err)
			}
			if seenFile[f.Name] {
				bad("rank %d: file %q given twice", r.Rank, f.Name)
			}
			seenFile[f.Name] = true
			for ti := range f.Tensors {
				t := &f.Tensors[ti]
				where := fmt.Sprintf("rank %d file %q tensor %q", r.Rank, f.Name, t.Name)
				if prev, dup := seenTensor[t.Name]; dup {
					bad("%s: name already used in file %q of the same rank", where, prev)
				}
				seenTensor[t.Name] = f.Name
				if err := t.check(); err != nil {
					bad("%s: %v", where, err)
				}
			}
		}
	}
	switch len(errs) {
	case 0:
		return nil
	case 1:
		return invalidf("%s", errs[0])
	}
	return invalidf("%d problems:\n  %s", len(errs), strings.Join(errs, "\n  "))
}

// check validates one tensor.
func (t *Tensor) check() error {
	if t.err != nil {
		return t.err
	}
	if t.Name == "" {
		return errors.New("empty tensor name")
	}
	if t.Name == "__metadata__" {
		return errors.New("the name __metadata__ is reserved by the safetensors format")
	}
	if !utf8.ValidString(t.Name) {
		return errors.New("tensor name is not valid UTF-8")
	}
	switch t.DType {
	case swapper.Float32, swapper.BFloat16, swapper.Float16, tensor.Uint8:
	default:
		return fmt.Errorf("unknown dtype %d", t.DType)
	}
	elems, err := numElements(t.Shape)
	if err != nil {
		return err
	}
	if want := elems * int64(t.DType.Size()); want != t.Bytes {
		return fmt.Errorf("shape %v of %s is %d bytes, but the tensor has %d", t.Shape, t.DType, want, t.Bytes)
	}
	if t.Bytes > 0 && t.Read == nil && t.store == nil {
		return errors.New("tensor has no source (Read is nil)")
	}
	return nil
}

// numElements is the product of shape, checking for negative dimensions and
// overflow.
func numElements(shape []int64) (int64, error) {
	n := int64(1)
	for _, d := range shape {
		if d < 0 {
			return 0, fmt.Errorf("shape %v has a negative dimension", shape)
		}
		hi, lo := bits.Mul64(uint64(n), uint64(d))
		if hi != 0 || lo > math.MaxInt64/4 {
			return 0, fmt.Errorf("shape %v has too many elements", shape)
		}
		n = int64(lo)
	}
	return n, nil
}

// checkFileName accepts a plain base name ending in ".safetensors".
func checkFileName(name string) error {
	switch {
	case name == "":
		return errors.New("empty file name")
	case name != filepath.Base(name) || strings.ContainsAny(name, `/\`) || name == "." || name == "..":
		return fmt.Errorf("file name %q must be a plain name, not a path", name)
	case strings.HasPrefix(name, "."):
		return fmt.Errorf("file name %q must not start with a dot", name)
	case !strings.HasSuffix(name, ".safetensors") || name == ".safetensors":
		return fmt.Errorf("file name %q must end in .safetensors", name)
	case !utf8.ValidString(name):
		return fmt.Errorf("file name %q is not valid UTF-8", name)
	}
	return nil
}

// ceilPow2 is the smallest power of two >= n (1 for n <= 1).
func ceilPow2(n uint64) uint64 {
	if n <= 1 {
		return 1
	}
	return 1 << bits.Len64(n-1)
}

func roundUp(n, to int64) int64 { return (n + to - 1) / to * to }

package generate

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/gomlx/compute"
	"golang.org/x/sys/unix"

	"github.com/zinfio/zinf/buffers"
	"github.com/zinfio/zinf/regfile"
	"github.com/zinfio/zinf/tensor"
)

// Advice is what OpenMapped tells the kernel about its mapping.
type Advice int

const (
	// AdviceNone is a plain mapping: the kernel pages the weights in on
	// the faults of the copies, with its default readahead.
	AdviceNone Advice = iota
	// AdviceSequential is madvise(MADV_SEQUENTIAL) over each mapped file.
	AdviceSequential
	// AdviceWillNeed is MADV_SEQUENTIAL, and madvise(MADV_WILLNEED) on the
	// next layer's bytes as each layer begins (after the head: the first
	// transformer layer's, for the next pass): the best a careful mmap
	// user does.
	AdviceWillNeed
)

func (a Advice) String() string {
	switch a {
	case AdviceNone:
		return "plain"
	case AdviceSequential:
		return "sequential"
	case AdviceWillNeed:
		return "willneed"
	}
	return fmt.Sprintf("Advice(%d)", int(a))
}

// ParseAdvice reads plain, sequential or willneed.
func ParseAdvice(s string) (Advice, error) {
	for _, a := range []Advice{AdviceNone, AdviceSequential, AdviceWillNeed} {
		if s == a.String() {
			return a, nil
		}
	}
	return 0, fmt.Errorf("mmap advice %q (allowed: plain, sequential, willneed)", s)
}

// MappedOptions adjust OpenMapped.
type MappedOptions struct {
	Advice Advice
}

// OpenMapped opens the model fn builds with its weights in safetensors
// files that hold each variable under its own path (Var.Name) in the
// model's dtype (as WriteRandomModel writes them), or in bfloat16 or
// float16 for a float32 model (each weight widened as its layer is built:
// a half-precision model computed in fp32), mapped whole into memory
// (mmap, read-only, shared) and paged by the kernel: the baseline a Go user
// reaches for with a model larger than memory. Each layer's tensors are
// built from the mapped bytes when the layer runs (copied into the same
// swap-in slots Open's runtime fills), with the same executors, KV cache
// semantics (on the Go heap) and sampling, so its tokens equal Open's.
// Result.IOWait is the time spent building the layers' tensors (the page
// faults' reads and the copies, and MADV_WILLNEED's calls); BytesRead the
// bytes copied from the mapping. The Generator has no zinf runtime
// (Runtime returns nil) and no PlanBatch.
func OpenMapped(ctx context.Context, backend compute.Backend, fn ModelFn, o MappedOptions, files ...string) (g *Generator, err error) {
	if backend == nil || fn == nil || len(files) == 0 {
		return nil, errors.New("zinf generate: OpenMapped needs a backend, a ModelFn and safetensors files")
	}
	if o.Advice < AdviceNone || o.Advice > AdviceWillNeed {
		return nil, fmt.Errorf("zinf generate: %s (allowed: plain, sequential, willneed)", o.Advice)
	}
	st, err := SafetensorsWeights(nil, files...)
	if err != nil {
		return nil, err
	}
	backend = WithKVCacheOps(backend)
	store, m, vars, err := build(backend, fn)
	if err != nil {
		return nil, err
	}
	if err := st.CheckModel(vars); err != nil {
		store.Finalize()
		return nil, err
	}
	src := &mappedSource{maps: map[string][]byte{}, at: map[string]stEntry{}, layers: make([][]stEntry, m.NumLayers+2), advice: o.Advice}
	g = newGenerator(src, backend, store, m, vars)
	gen := g // a failed return sets g to nil before the deferred Close
	defer func() {
		if err != nil {
			gen.Close()
		}
	}()
	for i, v := range vars {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		e, ok := st.entries[v.Name]
		if !ok {
			return nil, fmt.Errorf("zinf generate: no tensor %q in %v", v.Name, files)
		}
		zd, err := zdtype(v.Shape.DType)
		if err != nil {
			return nil, err
		}
		if (e.dtype != zd && zd != tensor.Float32) || fits(e, v.Name, false, v) != nil {
			return nil, fmt.Errorf("zinf generate: %s holds %q as %s %v, the model has %s (a mapped model is used as it lies: same dtype and shape, or a bf16/fp16 file widened for a float32 model)", e.file, v.Name, e.dtype, e.shape, v.Shape)
		}
		if _, ok := src.maps[e.file]; !ok {
			b, err := mapFile(e.file, o.Advice)
			if err != nil {
				return nil, err
			}
			src.maps[e.file] = b
		}
		src.at[v.Name] = e
		src.layers[v.Layer] = append(src.layers[v.Layer], e)
		g.byLayer[v.Layer] = append(g.byLayer[v.Layer], i)
		if err := g.bind(v); err != nil {
			return nil, err
		}
	}
	if err := g.finish(); err != nil {
		return nil, err
	}
	return g, nil
}

// mapFile maps path read-only and shared, with the advice's madvise.
func mapFile(path string, a Advice) ([]byte, error) {
	f, fi, err := regfile.Open(path)
	if err != nil {
		return nil, fmt.Errorf("zinf generate: %w", err)
	}
	defer f.Close() // the mapping outlives the descriptor
	if fi.Size() <= 0 || int64(int(fi.Size())) != fi.Size() {
		return nil, fmt.Errorf("zinf generate: %s: %d bytes cannot be mapped", path, fi.Size())
	}
	b, err := unix.Mmap(int(f.Fd()), 0, int(fi.Size()), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("zinf generate: mmap %s (%d bytes): %w", path, fi.Size(), err)
	}
	if a == AdviceSequential || a == AdviceWillNeed {
		if err := unix.Madvise(b, unix.MADV_SEQUENTIAL); err != nil {
			unix.Munmap(b)
			return nil, fmt.Errorf("zinf generate: madvise(MADV_SEQUENTIAL) %s: %w", path, err)
		}
	}
	return b, nil
}

// mappedSource gives a Generator its weights from mapped files.
type mappedSource struct {
	maps   map[string][]byte  // file -> its mapping
	at     map[string]stEntry // variable path -> where it lies
	layers [][]stEntry        // per zinf layer, its tensors
	advice Advice
	wait   time.Duration
	read   int64
}

// weightBytes is what a pass takes from the mapping: every weight as its
// file holds it (a widened one by the file's dtype), but of rows (the
// embedding read by rows) none.
func (s *mappedSource) weightBytes(vars []Var, rows *Var) int64 {
	var n int64
	for i, v := range vars {
		switch e, ok := s.at[v.Name]; {
		case rows != nil && &vars[i] == rows:
		case ok:
			n += e.end - e.begin
		default:
			n += v.Shape.ByteSize()
		}
	}
	return n
}

func (s *mappedSource) forward(bool) {}
func (s *mappedSource) endPasses()   {}

func (s *mappedSource) beginLayer(ctx context.Context, l int) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if s.advice != AdviceWillNeed {
		return nil
	}
	next := l + 1
	if next >= len(s.layers) { // after the head: the next pass's first transformer layer
		next = min(1, len(s.layers)-1)
	}
	t0 := time.Now()
	defer func() { s.wait += time.Since(t0) }()
	page := int64(os.Getpagesize())
	for _, e := range s.layers[next] {
		m := s.maps[e.file]
		lo := e.begin / page * page
		if err := unix.Madvise(m[lo:e.end], unix.MADV_WILLNEED); err != nil {
			return fmt.Errorf("zinf generate: madvise(MADV_WILLNEED) %s [%d, %d): %w", e.file, lo, e.end, err)
		}
	}
	return nil
}

func (s *mappedSource) endLayer(int) {}

func (s *mappedSource) entry(v Var, dt tensor.DType) (stEntry, []byte, error) {
	e, ok := s.at[v.Name]
	if !ok {
		return e, nil, fmt.Errorf("zinf generate: %q is not mapped", v.Name)
	}
	if e.dtype != dt && dt != tensor.Float32 {
		// Widening to fp32 (a bf16 or fp16 file, a model computed in
		// fp32) is exact; narrowing would round: refused.
		return e, nil, fmt.Errorf("zinf generate: %q is mapped as %s, asked for as %s (allowed: %s, or float32)", v.Name, e.dtype, dt, e.dtype)
	}
	return e, s.maps[e.file], nil
}

func (s *mappedSource) readParam(_ context.Context, v Var, dt tensor.DType, dst []byte) error {
	e, m, err := s.entry(v, dt)
	if err != nil {
		return err
	}
	if want := (e.end - e.begin) / int64(e.dtype.Size()) * int64(dt.Size()); int64(len(dst)) != want {
		return fmt.Errorf("zinf generate: %q has %d bytes as %s, the buffer %d", v.Name, want, dt, len(dst))
	}
	t0 := time.Now()
	buffers.Transcode(e.dtype, m[e.begin:e.end], dt, dst) // a copy when the dtypes agree
	s.wait += time.Since(t0)
	s.read += e.end - e.begin // the bytes taken from the mapping (before any widening)
	return nil
}

func (s *mappedSource) readRows(_ context.Context, v Var, rows []int, dt tensor.DType, dst []byte) error {
	e, m, err := s.entry(v, dt)
	if err != nil {
		return err
	}
	if len(e.shape) != 2 {
		return fmt.Errorf("zinf generate: %q has shape %v: rows of a 2-D tensor only", v.Name, e.shape)
	}
	rowBytes, outBytes := e.shape[1]*int64(e.dtype.Size()), e.shape[1]*int64(dt.Size())
	if int64(len(dst)) != int64(len(rows))*outBytes {
		return fmt.Errorf("zinf generate: %d rows of %q are %d bytes as %s, the buffer %d", len(rows), v.Name, int64(len(rows))*outBytes, dt, len(dst))
	}
	t0 := time.Now()
	defer func() { s.wait += time.Since(t0) }()
	for i, r := range rows {
		if r < 0 || int64(r) >= e.shape[0] {
			return fmt.Errorf("zinf generate: row %d of %q (allowed: 0..%d)", r, v.Name, e.shape[0]-1)
		}
		at := e.begin + int64(r)*rowBytes
		buffers.Transcode(e.dtype, m[at:at+rowBytes], dt, dst[int64(i)*outBytes:(int64(i)+1)*outBytes])
		s.read += rowBytes
	}
	return nil
}

func (s *mappedSource) ioWait() time.Duration { return s.wait }
func (s *mappedSource) bytesRead() int64      { return s.read }

func (s *mappedSource) openKV(layers int, layerBytes int64) (kvCache, error) {
	c, err := newMemKV(layers, layerBytes)
	if err != nil {
		return nil, err
	}
	return c, nil
}

func (s *mappedSource) close() error {
	var errs []error
	for f, b := range s.maps {
		if err := unix.Munmap(b); err != nil {
			errs = append(errs, fmt.Errorf("zinf generate: munmap %s: %w", f, err))
		}
		delete(s.maps, f)
	}
	return errors.Join(errs...)
}

package checkpoint

import (
	"bytes"
	"context"
	"errors"
	"math/rand/v2"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/zinfio/zinf/aio"
	"github.com/zinfio/zinf/swapper"
)

// writeGate holds every write until opened.
type writeGate struct {
	once sync.Once
	open chan struct{}
}

func (g *writeGate) Before(p aio.PieceInfo) aio.Fault {
	if p.Op == aio.OpWrite {
		<-g.open
	}
	return aio.Fault{}
}

func (g *writeGate) release() { g.once.Do(func() { close(g.open) }) }

// pinnedSource is a FromPinned source over a private copy of a spec's
// bytes, cut into segments, counting pins and releases.
type pinnedSource struct {
	held     []byte
	segs     [][]byte
	pins     atomic.Int32
	releases atomic.Int32
	fail     error // returned by pin when set
}

func newPinnedSource(rng *rand.Rand, data []byte) *pinnedSource {
	src := &pinnedSource{held: append([]byte(nil), data...)}
	rest := src.held
	for len(rest) > 0 {
		n := min(len(rest), 1+rng.IntN(len(data)/3+1))
		src.segs = append(src.segs, rest[:n])
		rest = rest[n:]
	}
	return src
}

func (p *pinnedSource) pin(context.Context) ([][]byte, func(), error) {
	if p.fail != nil {
		return nil, nil, p.fail
	}
	p.pins.Add(1)
	return p.segs, func() { p.releases.Add(1) }, nil
}

func (p *pinnedSource) balanced() bool { return p.pins.Load() == p.releases.Load() }

// pinnedSpecs makes every other spec a FromPinned tensor over its own
// source; mk makes the State's tensors.
func pinnedSpecs(rng *rand.Rand, specs []spec) (map[string]*pinnedSource, func(spec) Tensor) {
	srcs := map[string]*pinnedSource{}
	for i, s := range specs {
		if i%2 == 0 {
			srcs[s.name] = newPinnedSource(rng, s.data)
		}
	}
	return srcs, func(s spec) Tensor {
		if src, ok := srcs[s.name]; ok {
			return FromPinned(s.name, s.dtype, s.shape, int64(len(s.data)), src.pin)
		}
		return FromBytes(s.name, s.dtype, s.shape, s.data)
	}
}

// TestSaveAsyncFromPinned: SaveAsync pins each FromPinned tensor once
// while it holds the caller (it returns with every write held and no pin
// released), copies the others (their later changes do not reach the
// checkpoint), and releases each pin once, after the drain.
func TestSaveAsyncFromPinned(t *testing.T) {
	rng := rand.New(rand.NewPCG(21, 21))
	g := &writeGate{open: make(chan struct{})}
	defer g.release()
	specs := makeSpecs(rng, []string{"params.safetensors", "optimizer.safetensors"},
		[]int{1<<20 + 4, 3<<20 + 6, 4098, 8192, 0, 12, 70000})
	srcs, mk := pinnedSpecs(rng, specs)
	st := stateOf(1, specs, mk)
	s := NewSaver(SaverOptions{})
	defer s.Close()
	dir := filepath.Join(t.TempDir(), "step-000001")
	h, err := s.SaveAsync(context.Background(), dir, st, SaveOptions{StagingBytes: 1 << 20, Engine: testEngine(t, g)})
	if err != nil {
		t.Fatal(err)
	}
	want := make([]spec, len(specs))
	copied := 0
	for i, sp := range specs {
		want[i] = sp
		want[i].data = append([]byte(nil), sp.data...)
		src, ok := srcs[sp.name]
		if !ok {
			// Copied into the snapshot: training may change it now.
			rng.Shuffle(len(sp.data), func(i, j int) { sp.data[i], sp.data[j] = sp.data[j], sp.data[i] })
			copied++
			continue
		}
		wantPins := int32(1)
		if len(sp.data) == 0 {
			wantPins = 0 // nothing to hold
		}
		if p, r := src.pins.Load(), src.releases.Load(); p != wantPins || r != 0 {
			t.Fatalf("%s: %d pins, %d releases when SaveAsync returned, want %d and 0", sp.name, p, r, wantPins)
		}
	}
	if copied == 0 {
		t.Fatal("test broken: no copied tensors")
	}
	g.release()
	if _, err := h.Wait(); err != nil {
		t.Fatal(err)
	}
	for name, src := range srcs {
		if !src.balanced() {
			t.Fatalf("%s: %d pins, %d releases after the save", name, src.pins.Load(), src.releases.Load())
		}
	}
	checkReadBack(t, dir, 0, want)
}

// TestSaveAsyncDoesNotCopyPinned: the drain reads a FromPinned tensor's
// pinned memory itself, after SaveAsync returned; SaveAsync made no copy.
// The drain is held at its first write (one staging buffer, writes gated)
// before it reaches the pinned tensor, whose memory the test then changes
// (which a real source must not do before the release): the checkpoint
// has the changed bytes.
func TestSaveAsyncDoesNotCopyPinned(t *testing.T) {
	rng := rand.New(rand.NewPCG(24, 24))
	g := &writeGate{open: make(chan struct{})}
	defer g.release()
	specs := makeSpecs(rng, []string{"a.safetensors"}, []int{1 << 20, 64 << 10})
	specs[1].dtype, specs[1].shape = swapper.Float32, []int64{16 << 10} // laid out after the first
	src := newPinnedSource(rng, specs[1].data)
	st := stateOf(1, specs, func(s spec) Tensor {
		if s.name == specs[1].name {
			return FromPinned(s.name, s.dtype, s.shape, int64(len(s.data)), src.pin)
		}
		return FromBytes(s.name, s.dtype, s.shape, s.data)
	})
	s := NewSaver(SaverOptions{})
	defer s.Close()
	dir := filepath.Join(t.TempDir(), "step-000001")
	h, err := s.SaveAsync(context.Background(), dir, st, SaveOptions{StagingBytes: 64 << 10, StagingBuffers: 1, Engine: testEngine(t, g)})
	if err != nil {
		t.Fatal(err)
	}
	for i := range src.held {
		src.held[i] ^= 0x5a
	}
	specs[1].data = append([]byte(nil), src.held...)
	g.release()
	if _, err := h.Wait(); err != nil {
		t.Fatal(err)
	}
	checkReadBack(t, dir, 0, specs)
	if !src.balanced() || src.pins.Load() != 1 {
		t.Fatalf("%d pins, %d releases", src.pins.Load(), src.releases.Load())
	}
}

// TestSaveFromPinned: a synchronous Save pins each FromPinned tensor when
// it reaches it and releases it before returning, streaming the segments
// through small staging buffers.
func TestSaveFromPinned(t *testing.T) {
	rng := rand.New(rand.NewPCG(22, 22))
	specs := makeSpecs(rng, []string{"a.safetensors", "b.safetensors"}, []int{40000, 4098, 0, 123456, 12})
	srcs, mk := pinnedSpecs(rng, specs)
	st := stateOf(1, specs, mk)
	root := t.TempDir()
	for _, name := range []string{"one", "two"} { // a State may be saved twice
		if _, err := Save(context.Background(), filepath.Join(root, name), st, SaveOptions{StagingBytes: 4096, Engine: testEngine(t, nil)}); err != nil {
			t.Fatal(err)
		}
		checkReadBack(t, filepath.Join(root, name), 0, specs)
	}
	for name, src := range srcs {
		want := int32(2)
		if len(src.held) == 0 {
			want = 0
		}
		if src.pins.Load() != want || !src.balanced() {
			t.Fatalf("%s: %d pins, %d releases after two saves, want %d each", name, src.pins.Load(), src.releases.Load(), want)
		}
	}
	// Read works on its own too.
	for _, sp := range specs {
		src, ok := srcs[sp.name]
		if !ok || len(sp.data) < 10 {
			continue
		}
		tn := mk(sp)
		dst := make([]byte, 7)
		if err := tn.Read(context.Background(), dst, 3); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(dst, sp.data[3:10]) || !src.balanced() {
			t.Fatalf("%s: Read gave %x, want %x (balanced %v)", sp.name, dst, sp.data[3:10], src.balanced())
		}
	}
}

// TestFromPinnedErrors: a failing pin, a source of the wrong length and a
// nil pin function fail the save, naming the tensor, with every pin taken
// released and nothing left behind.
func TestFromPinnedErrors(t *testing.T) {
	rng := rand.New(rand.NewPCG(23, 23))
	specs := makeSpecs(rng, []string{"a.safetensors"}, []int{8192, 4096, 16384, 1000})
	boom := errors.New("boom")
	root := t.TempDir()
	s := NewSaver(SaverOptions{})
	defer s.Close()
	for _, c := range []struct {
		name    string
		breakIt func(srcs map[string]*pinnedSource) string // returns the tensor that fails
		want    error
	}{
		{"pin-fails", func(srcs map[string]*pinnedSource) string {
			srcs[specs[2].name].fail = boom
			return specs[2].name
		}, boom},
		{"short-source", func(srcs map[string]*pinnedSource) string {
			src := srcs[specs[2].name]
			src.segs = src.segs[:len(src.segs)-1]
			return specs[2].name
		}, nil},
	} {
		for _, async := range []bool{false, true} {
			srcs, mk := pinnedSpecs(rng, specs)
			bad := c.breakIt(srcs)
			st := stateOf(1, specs, mk)
			dir := filepath.Join(root, c.name)
			var err error
			if async {
				var h *Handle
				if h, err = s.SaveAsync(context.Background(), dir, st, SaveOptions{}); err == nil {
					_, err = h.Wait()
					t.Errorf("%s async: the error came from Wait, not SaveAsync", c.name)
				}
			} else {
				_, err = Save(context.Background(), dir, st, SaveOptions{})
			}
			var ce *Error
			if err == nil || !errors.As(err, &ce) || ce.Tensor != bad || (c.want != nil && !errors.Is(err, c.want)) {
				t.Fatalf("%s async=%v: %v, want an *Error about %s", c.name, async, err, bad)
			}
			for name, src := range srcs {
				if !src.balanced() {
					t.Fatalf("%s async=%v: %s pinned %d times, released %d", c.name, async, name, src.pins.Load(), src.releases.Load())
				}
			}
			assertNoTemp(t, root)
		}
	}
	nilPin := FromPinned("x", swapper.Float32, []int64{1}, 4, nil)
	st := State{Step: 1, Ranks: []RankState{{Files: []TensorFile{{Name: "x.safetensors", Tensors: []Tensor{nilPin}}}}}}
	if _, err := Save(context.Background(), filepath.Join(root, "nil"), st, SaveOptions{}); !errors.Is(err, ErrInvalid) {
		t.Fatalf("nil pin function: %v", err)
	}
}

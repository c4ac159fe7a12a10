package checkpoint

import (
	"context"
	"errors"
	"math/rand/v2"
	"path/filepath"
	"sync"
	"testing"

	"github.com/zinfio/zinf/aio"
	"github.com/zinfio/zinf/swapper"
)

// readGate holds every read until opened.
type readGate struct {
	once sync.Once
	open chan struct{}
}

func (g *readGate) Before(p aio.PieceInfo) aio.Fault {
	if p.Op == aio.OpRead {
		<-g.open
	}
	return aio.Fault{}
}

func (g *readGate) release() { g.once.Do(func() { close(g.open) }) }

// TestSaveAsyncPinsStoreTensors: SaveAsync does not read FromStore
// tensors (it returns while every store read is held); it pins their
// versions, so the checkpoint holds them as they were at SaveAsync even
// though they are overwritten and deleted before the drain reads them.
// The replaced versions are freed once the save is done.
func TestSaveAsyncPinsStoreTensors(t *testing.T) {
	rng := rand.New(rand.NewPCG(9, 9))
	g := &readGate{open: make(chan struct{})}
	defer g.release()
	store, pool := newStore(t, testEngine(t, g))
	specs := makeSpecs(rng, []string{"params.safetensors", "params.safetensors", "params.safetensors", "optimizer.safetensors"},
		[]int{1<<20 + 4, 3<<20 + 6, 4098, 8192})
	storeOf := map[string]string{specs[1].name: "a", specs[3].name: "b"}
	for name, key := range storeOf {
		for _, s := range specs {
			if s.name == name {
				writeStore(t, store, pool, key, s.data)
			}
		}
	}
	mk := func(s spec) Tensor {
		if key, ok := storeOf[s.name]; ok {
			t := FromStore(store, key, s.dtype, s.shape)
			t.Name = s.name
			return t
		}
		return FromBytes(s.name, s.dtype, s.shape, append([]byte(nil), s.data...))
	}
	// The next version of "a", written aside now: the engine's workers
	// are about to be held by the gated reads.
	writeStore(t, store, pool, "a@next", make([]byte, len(specs[1].data)))
	dir := filepath.Join(t.TempDir(), "step-000001")
	s := NewSaver(SaverOptions{})
	defer s.Close()
	h, err := s.SaveAsync(context.Background(), dir, stateOf(1, specs, mk), SaveOptions{StagingBytes: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	// SaveAsync returned with every store read still held: it read none.
	// Training goes on: "a" gets a new version, "b" is dropped.
	if err := store.Rename([2]string{"a@next", "a"}); err != nil {
		t.Fatal(err)
	}
	store.Delete("b")
	g.release()
	if _, err := h.Wait(); err != nil {
		t.Fatal(err)
	}
	checkReadBack(t, dir, 0, specs)
	if got, want := store.Stats().LiveBytes, store.PaddedLen(int64(len(specs[1].data))); got != want {
		t.Fatalf("store live bytes %d after the save, want %d (only the new version of a)", got, want)
	}
}

// TestSaveAsyncStoreTensorGone: a FromStore tensor deleted between the
// Tensor's creation and SaveAsync fails the save at once, naming it, and
// pins nothing.
func TestSaveAsyncStoreTensorGone(t *testing.T) {
	store, pool := newStore(t, testEngine(t, nil))
	writeStore(t, store, pool, "a", make([]byte, 4096))
	writeStore(t, store, pool, "b", make([]byte, 4096))
	ta := FromStore(store, "a", swapper.Float32, []int64{1024})
	tb := FromStore(store, "b", swapper.Float32, []int64{1024})
	store.Delete("b")
	s := NewSaver(SaverOptions{})
	defer s.Close()
	st := State{Step: 1, Ranks: []RankState{{Files: []TensorFile{{Name: "p.safetensors", Tensors: []Tensor{ta, tb}}}}}}
	root := t.TempDir()
	_, err := s.SaveAsync(context.Background(), filepath.Join(root, "x"), st, SaveOptions{})
	if !errors.Is(err, swapper.ErrNotFound) {
		t.Fatalf("SaveAsync with a deleted store tensor: %v", err)
	}
	store.Delete("a")
	if live := store.Stats().LiveBytes; live != 0 {
		t.Fatalf("%d bytes still live: a pin was kept", live)
	}
	assertNoTemp(t, root)
}

// TestFromStoreRanges saves the three states interleaved in two
// optimizer-style records (master | exp_avg | exp_avg_sq per sub-group) as
// three tensors, synchronously and asynchronously (the records replaced
// right after SaveAsync), and reads back exactly the bytes they had.
func TestFromStoreRanges(t *testing.T) {
	rng := rand.New(rand.NewPCG(10, 10))
	store, pool := newStore(t, testEngine(t, nil))
	sizes := []int64{1000, 333} // elements per sub-group
	var recs [][]byte
	for j, n := range sizes {
		rec := randomTensorBytes(rng, swapper.Float32, int(3*n))
		recs = append(recs, rec)
		writeStore(t, store, pool, "opt/w#"+string(rune('0'+j)), rec)
	}
	var specs []spec
	var tensors []Tensor
	for k, what := range []string{"master", "exp_avg", "exp_avg_sq"} {
		var data []byte
		var ranges []StoreRange
		for j, n := range sizes {
			data = append(data, recs[j][4*int64(k)*n:4*int64(k+1)*n]...)
			ranges = append(ranges, StoreRange{Name: "opt/w#" + string(rune('0'+j)), Off: 4 * int64(k) * n, Len: 4 * n})
		}
		shape := []int64{sizes[0] + sizes[1]}
		specs = append(specs, spec{file: "optimizer.safetensors", name: "w." + what, dtype: swapper.Float32, shape: shape, data: data})
		tensors = append(tensors, FromStoreRanges(store, "w."+what, swapper.Float32, shape, ranges))
	}
	st := State{Step: 1, Ranks: []RankState{{Files: []TensorFile{{Name: "optimizer.safetensors", Tensors: tensors}}}}}
	root := t.TempDir()
	if _, err := Save(context.Background(), filepath.Join(root, "sync"), st, SaveOptions{StagingBytes: 4096}); err != nil {
		t.Fatal(err)
	}
	checkReadBack(t, filepath.Join(root, "sync"), 0, specs)
	s := NewSaver(SaverOptions{})
	defer s.Close()
	h, err := s.SaveAsync(context.Background(), filepath.Join(root, "async"), st, SaveOptions{StagingBytes: 4096})
	if err != nil {
		t.Fatal(err)
	}
	for j, n := range sizes {
		writeStore(t, store, pool, "opt/w#"+string(rune('0'+j)), make([]byte, 12*n))
	}
	if _, err := h.Wait(); err != nil {
		t.Fatal(err)
	}
	checkReadBack(t, filepath.Join(root, "async"), 0, specs)

	bad := FromStoreRanges(store, "x", swapper.Float32, []int64{1}, []StoreRange{{Name: "opt/w#1", Off: 12*333 - 2, Len: 4}})
	st = State{Step: 1, Ranks: []RankState{{Files: []TensorFile{{Name: "x.safetensors", Tensors: []Tensor{bad}}}}}}
	if _, err := Save(context.Background(), filepath.Join(root, "bad"), st, SaveOptions{}); !errors.Is(err, ErrInvalid) {
		t.Fatalf("a range past the store tensor's end: %v", err)
	}
}

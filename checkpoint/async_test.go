package checkpoint

import (
	"context"
	"errors"
	"math/rand/v2"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/zinfio/zinf/aio"
	"github.com/zinfio/zinf/internal/test/faults"
)

// gate is a fault hook that holds every write until opened: while it is
// shut, nothing of a save reaches the disk.
type gate struct {
	once   sync.Once
	open   chan struct{}
	mu     sync.Mutex
	writes int
}

func newGate() *gate { return &gate{open: make(chan struct{})} }

func (g *gate) Before(p aio.PieceInfo) aio.Fault {
	if p.Op == aio.OpWrite {
		<-g.open
		g.mu.Lock()
		g.writes++
		g.mu.Unlock()
	}
	return aio.Fault{}
}

func (g *gate) release() { g.once.Do(func() { close(g.open) }) }

func TestSaveAsyncSnapshot(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 5))
	g := newGate()
	defer g.release()
	eng := testEngine(t, g)
	eng2 := testEngine(t, nil)
	store, pool := newStore(t, eng2)
	specs := makeSpecs(rng, []string{"params.safetensors", "optimizer.safetensors"}, []int{4098, 1<<20 + 6, 6 << 20, 12, 0})
	storeSpec := makeSpecs(rng, []string{"optimizer.safetensors"}, []int{256<<10 + 2})[0]
	storeSpec.name = "from.store"
	writeStore(t, store, pool, "s", storeSpec.data)

	// Sources the test mutates after SaveAsync returns.
	sources := make(map[string][]byte)
	want := append([]spec{}, specs...)
	for i := range want {
		sources[want[i].name] = append([]byte(nil), want[i].data...)
	}
	mk := func(s spec) Tensor {
		if s.name == storeSpec.name {
			t := FromStore(store, "s", s.dtype, s.shape)
			t.Name = s.name
			return t
		}
		return FromBytes(s.name, s.dtype, s.shape, sources[s.name])
	}
	want = append(want, storeSpec)
	root := t.TempDir()
	dir := filepath.Join(root, "step-000003")
	s := NewSaver(SaverOptions{})
	defer s.Close()
	t0 := time.Now()
	h, err := s.SaveAsync(context.Background(), dir, stateOf(3, want, mk), SaveOptions{Engine: eng, StagingBytes: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	returned := time.Since(t0)
	// The gate holds every write: SaveAsync returned before any data was
	// written, and the save is not done.
	select {
	case <-h.Done():
		t.Fatal("save finished while its writes were held")
	default:
	}
	if !s.InFlight() {
		t.Fatal("InFlight false during a save")
	}
	if _, err := Latest(root); !errors.Is(err, ErrNoCheckpoint) {
		t.Fatalf("Latest during the save: %v", err)
	}
	// The training loop moves on: overwrite every source.
	for _, b := range sources {
		for i := range b {
			b[i] ^= 0xff
		}
	}
	writeStore(t, store, pool, "s", make([]byte, len(storeSpec.data)))
	g.release()
	m, err := h.Wait()
	if err != nil {
		t.Fatal(err)
	}
	total := time.Since(t0)
	t.Logf("SaveAsync returned after %v (snapshot %v, %d bytes pinned); save committed after %v",
		returned, h.SnapshotDuration(), h.SnapshotBytes(), total)
	if m.Dir != dir {
		t.Fatalf("manifest dir %q", m.Dir)
	}
	checkReadBack(t, dir, 0, want) // the bytes as they were at SaveAsync
	if s.InFlight() {
		t.Fatal("InFlight after Wait")
	}
}

func TestSaveAsyncOneInFlight(t *testing.T) {
	rng := rand.New(rand.NewPCG(6, 6))
	g := newGate()
	defer g.release()
	eng := testEngine(t, g)
	specs := makeSpecs(rng, []string{"p.safetensors"}, []int{1 << 20})
	root := t.TempDir()
	s := NewSaver(SaverOptions{})
	defer s.Close()
	h1, err := s.SaveAsync(context.Background(), filepath.Join(root, "a"), stateOf(1, specs, fromMemory), SaveOptions{Engine: eng})
	if err != nil {
		t.Fatal(err)
	}
	// A second save waits for the first; with a context that ends it gives
	// up with ErrSaveInFlight.
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if _, err := s.SaveAsync(ctx, filepath.Join(root, "b"), stateOf(2, specs, fromMemory), SaveOptions{Engine: eng}); !errors.Is(err, ErrSaveInFlight) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("second SaveAsync: %v, want ErrSaveInFlight", err)
	}
	done := make(chan *Handle)
	go func() {
		h2, err := s.SaveAsync(context.Background(), filepath.Join(root, "c"), stateOf(3, specs, fromMemory), SaveOptions{Engine: eng})
		if err != nil {
			t.Error(err)
		}
		done <- h2
	}()
	g.release()
	if _, err := h1.Wait(); err != nil {
		t.Fatal(err)
	}
	h2 := <-done
	if h2 == nil {
		t.FailNow()
	}
	if _, err := h2.Wait(); err != nil {
		t.Fatal(err)
	}
	list, _ := List(root)
	if len(list) != 2 || list[0].Name != "a" || list[1].Name != "c" {
		t.Fatalf("checkpoints %+v", list)
	}
	// The snapshot cap.
	s2 := NewSaver(SaverOptions{MaxSnapshotBytes: 1 << 20})
	defer s2.Close()
	big := makeSpecs(rng, []string{"p.safetensors"}, []int{2 << 20})
	if _, err := s2.SaveAsync(context.Background(), filepath.Join(root, "d"), stateOf(4, big, fromMemory), SaveOptions{Engine: eng}); !errors.Is(err, ErrSnapshotTooLarge) {
		t.Fatalf("oversized snapshot: %v", err)
	}
	assertNoTemp(t, root)
}

// A write error during the drain fails the save, commits nothing and
// leaves no temporary directory.
func TestSaveAsyncWriteError(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 7))
	specs := makeSpecs(rng, []string{"p.safetensors", "q.safetensors"}, []int{4 << 20, 4 << 20})
	root := t.TempDir()
	s := NewSaver(SaverOptions{})
	defer s.Close()
	eng := testEngine(t, faults.New(1, faults.Rule{Kind: faults.Writes, Nth: 3, Err: syscall.EIO}))
	h, err := s.SaveAsync(context.Background(), filepath.Join(root, "x"), stateOf(1, specs, fromMemory), SaveOptions{Engine: eng, StagingBytes: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := h.Wait(); err == nil || !errors.Is(err, aio.ErrIO) {
		t.Fatalf("Wait = %v, want an I/O error", err)
	}
	if _, err := Latest(root); !errors.Is(err, ErrNoCheckpoint) {
		t.Fatalf("Latest after a failed save: %v", err)
	}
	assertNoTemp(t, root)
	// The synchronous writer too.
	if _, err := Save(context.Background(), filepath.Join(root, "y"), stateOf(1, specs, fromMemory), SaveOptions{Engine: testEngine(t, faults.New(1, faults.Rule{Kind: faults.Writes, Nth: 5, Err: syscall.EIO}))}); !errors.Is(err, aio.ErrIO) {
		t.Fatalf("Save = %v, want an I/O error", err)
	}
	assertNoTemp(t, root)
}

package checkpoint

import (
	"context"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"testing"

	"github.com/zinfio/zinf/aio"
)

// TestWriterEngineOptions: the Writer's own engine moves whole staging
// buffers, all of them in flight, on one ring; the queue depth is capped
// at the engine's maximum.
func TestWriterEngineOptions(t *testing.T) {
	o := WriterEngineOptions(SaveOptions{})
	if o.BlockSizeBytes != DefaultStagingBytes || o.QueueDepth != DefaultStagingBuffers*DefaultParallel || o.IntraOpParallelism != 1 ||
		o.Direct != aio.DirectOptional || o.Backend != aio.BackendAuto {
		t.Fatalf("defaults: %+v", o)
	}
	o = WriterEngineOptions(SaveOptions{StagingBytes: 1 << 20, StagingBuffers: 1024, Parallel: 256})
	if o.QueueDepth != aio.MaxQueueDepth || o.BlockSizeBytes != 1<<20 {
		t.Fatalf("large: %+v", o)
	}
	if err := o.Validate(); err != nil {
		t.Fatal(err)
	}
}

// TestWriterReshapesEngine: one Writer saving with different staging
// shapes remakes its engine for each new shape and writes every
// checkpoint correctly; on io_uring its staging memory is moved as
// registered buffers. The same for a Saver.
func TestWriterReshapesEngine(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 5))
	specs := makeSpecs(rng, []string{"a.safetensors", "b.safetensors"}, []int{4096, 1<<20 + 6, 3 << 20, 7})
	shapes := []SaveOptions{
		{StagingBytes: 64 << 10, StagingBuffers: 2, Parallel: 1},
		{StagingBytes: 64 << 10, StagingBuffers: 2, Parallel: 1}, // same shape: same engine
		{StagingBytes: 256 << 10, StagingBuffers: 3, Parallel: 2},
		{},
	}
	w := NewWriter()
	defer w.Close()
	s := NewSaver(SaverOptions{})
	defer s.Close()
	var last aio.Engine
	for i, opts := range shapes {
		dir := filepath.Join(t.TempDir(), fmt.Sprint("step-", i))
		if _, err := w.Save(context.Background(), dir, stateOf(int64(i), specs, fromMemory), opts); err != nil {
			t.Fatal(err)
		}
		checkReadBack(t, dir, 0, specs)
		w.mu.Lock()
		eng, eo := w.engine, w.engineOpts
		w.mu.Unlock()
		want := WriterEngineOptions(opts)
		if !sameEngineShape(eo, want) {
			t.Fatalf("save %d: engine made with %+v, want the shape of %+v", i, eo, want)
		}
		if i == 1 && eng != last {
			t.Fatal("the same shape got a new engine")
		}
		if i == 2 && eng == last {
			t.Fatal("a new shape kept the old engine")
		}
		last = eng
		if eng.Name() == aio.BackendUring && eng.Stats().FixedBufferPieces == 0 {
			t.Fatalf("save %d: no staging write used a registered buffer", i)
		}

		adir := filepath.Join(t.TempDir(), fmt.Sprint("async-", i))
		h, err := s.SaveAsync(context.Background(), adir, stateOf(int64(i), specs, fromMemory), opts)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := h.Wait(); err != nil {
			t.Fatal(err)
		}
		checkReadBack(t, adir, 0, specs)
		s.mu.Lock()
		seng, seo := s.engine, s.engineOpts
		s.mu.Unlock()
		if !sameEngineShape(seo, want) {
			t.Fatalf("async save %d: engine made with %+v, want the shape of %+v", i, seo, want)
		}
		if seng.Name() == aio.BackendUring && seng.Stats().FixedBufferPieces == 0 {
			t.Fatalf("async save %d: no snapshot write used a registered buffer", i)
		}
	}
}

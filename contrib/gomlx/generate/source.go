package generate

import (
	"context"
	"fmt"
	"time"

	"github.com/zinfio/zinf"
	"github.com/zinfio/zinf/config"
	"github.com/zinfio/zinf/plan"
	"github.com/zinfio/zinf/tensor"
)

// source is where a Generator's weights come from, layer by layer: the
// zinf runtime (Open), or a mapped file (OpenMapped). The executors, the
// swap-in slots and the passes are the same for both.
type source interface {
	// forward starts a pass; repeat: the next pass repeats it (every
	// decoding step is the same forward pass), and its last layers
	// prefetch the next pass's first ones.
	forward(repeat bool)
	// endPasses gives back what the last pass prefetched for a pass that
	// does not come.
	endPasses()
	// beginLayer makes layer l's weights readable; endLayer releases them.
	beginLayer(ctx context.Context, l int) error
	endLayer(l int)
	// readParam copies v's bytes (dtype dt) into dst.
	readParam(ctx context.Context, v Var, dt tensor.DType, dst []byte) error
	// readRows copies rows of the 2-D v into dst, back to back.
	readRows(ctx context.Context, v Var, rows []int, dt tensor.DType, dst []byte) error
	// ioWait is the time passes waited for weights so far, bytesRead the
	// weight bytes read.
	ioWait() time.Duration
	bytesRead() int64
	openKV(layers int, layerBytes int64) (kvCache, error)
	close() error
}

// kvCache is the batch's KV cache (zinf.KVCache, or memKV).
type kvCache interface {
	Begin(ctx context.Context, l int) ([]byte, error)
	End(l, used int) error
	Plan() plan.KVCache
	Stats() zinf.KVCacheStats
	Close() error
}

// rtSource is the zinf runtime: weights streamed through the pinned pool,
// read through its serving read path (zinf.Reader), which knows nothing
// of training steps.
type rtSource struct {
	rt *zinf.Runtime
	rd *zinf.Reader
}

func (s rtSource) forward(repeat bool) {
	if repeat {
		s.rt.ForwardRepeating()
	} else {
		s.rt.Forward()
	}
}
func (s rtSource) endPasses()                                  { s.rt.ReleasePrefetched() }
func (s rtSource) beginLayer(ctx context.Context, l int) error { return s.rd.BeginLayer(ctx, l) }
func (s rtSource) endLayer(l int)                              { s.rd.EndLayer(l) }
func (s rtSource) readParam(ctx context.Context, v Var, dt tensor.DType, dst []byte) error {
	return s.rd.Copy(ctx, v.Name, dt, dst)
}
func (s rtSource) readRows(ctx context.Context, v Var, rows []int, dt tensor.DType, dst []byte) error {
	return s.rd.CopyRows(ctx, v.Name, rows, dt, dst)
}
func (s rtSource) ioWait() time.Duration { return s.rt.Metrics().IOWait }
func (s rtSource) bytesRead() int64      { return s.rt.Metrics().BytesRead }
func (s rtSource) openKV(layers int, layerBytes int64) (kvCache, error) {
	c, err := s.rt.OpenKVCache(layers, layerBytes)
	if err != nil {
		return nil, err
	}
	return c, nil
}
func (s rtSource) close() error { return s.rt.Close() }

// memKV is a KV cache on the Go heap, one entry per layer, for a
// Generator without a zinf runtime.
type memKV struct {
	layerBytes int64
	entries    [][]byte
	begun      int // the layer begun, -1 none
	stats      zinf.KVCacheStats
}

func newMemKV(layers int, layerBytes int64) (*memKV, error) {
	if layers <= 0 || layerBytes <= 0 {
		return nil, fmt.Errorf("zinf generate: KV cache of %d layers x %d bytes (allowed: > 0)", layers, layerBytes)
	}
	return &memKV{layerBytes: layerBytes, entries: make([][]byte, layers), begun: -1}, nil
}

func (c *memKV) Begin(_ context.Context, l int) ([]byte, error) {
	if l < 0 || l >= len(c.entries) {
		return nil, fmt.Errorf("zinf generate: KV cache layer %d (allowed: 0..%d)", l, len(c.entries)-1)
	}
	if c.begun >= 0 {
		return nil, fmt.Errorf("zinf generate: KV cache layer %d begun while layer %d is", l, c.begun)
	}
	if c.entries[l] == nil {
		c.entries[l] = make([]byte, c.layerBytes)
	}
	c.begun = l
	return c.entries[l], nil
}

func (c *memKV) End(l, used int) error {
	if l != c.begun {
		return fmt.Errorf("zinf generate: KV cache layer %d ended while layer %d is begun", l, c.begun)
	}
	c.begun = -1
	return nil
}

func (c *memKV) Plan() plan.KVCache {
	n := int64(len(c.entries)) * c.layerBytes
	return plan.KVCache{Device: config.KVCacheMemory, Layers: len(c.entries), LayerBytes: c.layerBytes, CacheBytes: n, MemoryBytes: n}
}

func (c *memKV) Stats() zinf.KVCacheStats { return c.stats }

func (c *memKV) Close() error {
	c.entries = nil
	return nil
}

// Package stream serves a GGUF model to zinf's native decoder with its
// weights streamed through a zinf inference runtime, for a model larger
// than the memory that would hold it:
//
//   - every weight is read where it lies in the GGUF file, with O_DIRECT
//     (zinf.Runtime.InitInPlace): nothing is copied to swap files and the
//     file is never written;
//   - a decoding pass swaps the layers into the pinned pool in order, with
//     the runtime's prefetch running ahead (into the next pass's first
//     layers too: every decoding pass is the same), and the decoder
//     computes on each weight where it landed (zinf.Reader.View);
//   - the weights the config's offload_param.max_in_cpu keeps stay in the
//     pool for good, read once when the model opens (largest first, so that
//     they pack: zinf.Runtime.WarmCache) and by no pass;
//   - the token embedding's rows are read from the file as the pass needs
//     them (decoder.Decoder.BeginRows), not the whole table.
//
// The config describes the tiers as for any zinf runtime: offload_param
// (device nvme, nvme_path, max_in_cpu), zinf.tiers.cpu_pinned_bytes, the
// aio section. The weights keep the file's types (f32, bf16, q8_0,
// q4_0): the runtime stores them as opaque 16-bit words, so the config's
// bf16.enabled may be given or not and fp16.enabled is refused. A file
// with f16 matrices is refused too (the decoder widens f16 to f32, which
// cannot be done where the bytes lie): convert it to bf16.
//
//	m, err := stream.Open(ctx, "model.gguf", cfg, stream.Options{})
//	...
//	d, _ := decoder.New(m.Config(), nil)
//	for each step: m.Pass(ctx, d, cache, tokens, pos, logits)
//	m.EndPasses(); m.Close()
package stream

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"time"

	"github.com/zinfio/zinf"
	"github.com/zinfio/zinf/config"
	"github.com/zinfio/zinf/decoder"
	"github.com/zinfio/zinf/decoder/kernels"
	"github.com/zinfio/zinf/gguf"
	"github.com/zinfio/zinf/plan"
	"github.com/zinfio/zinf/tensor"
)

// Options tune Open.
type Options struct {
	// Logger receives the runtime's and Open's messages. Default
	// slog.Default().
	Logger *slog.Logger
	// PrefetchDepth is the layers the runtime reads ahead (0: the plan's).
	PrefetchDepth int
	// NoBandwidthProbe opens the runtime without probing the NVMe paths'
	// bandwidth (the config's figures or cached ones serve the plan).
	NoBandwidthProbe bool
}

// wordType is how the runtime holds every weight: opaque 16-bit words
// (each GGUF tensor's bytes are even: 4 a value for f32, 2 for bf16, 34
// and 18 a block of 32 for q8_0 and q4_0).
const wordType = tensor.BFloat16

// weight is one tensor the runtime streams.
type weight struct {
	info  *gguf.TensorInfo
	typ   kernels.DType
	layer int // the runtime's layer
}

// Model is a GGUF model opened for streaming. Its methods are for one
// goroutine (the decoding loop's).
type Model struct {
	path string
	file *gguf.File
	info *gguf.Model
	cfg  *config.Config // the runtime's (the caller's, with bf16 words)
	rt   *zinf.Runtime
	rd   *zinf.Reader
	bind *decoder.Binding

	weights map[string]weight
	order   []string // the weights in the runtime's layer order
	emb     *gguf.TensorInfo
	embType kernels.DType
	embRow  int // bytes of one embedding row

	// A pass in progress.
	mw      decoder.ModelWeights
	lw      decoder.LayerWeights
	held    []func()
	scratch map[string][]byte // Copy's destinations where no View is had
	layer   int               // the runtime layer being bound
	passes  int
	closed  bool
}

// Open opens the GGUF file at path (the llama architecture, as
// gguf.File.Model reads it) and a zinf inference runtime on cfg that
// streams its weights from where they lie in the file. The runtime's
// layers are the model's transformer layers and, last, the head (the
// final norm and the output matrix, or the token embedding with a tied
// head); a layer's norms travel with its matrices.
func Open(ctx context.Context, path string, cfg *config.Config, o Options) (m *Model, err error) {
	if cfg == nil {
		return nil, errors.New("stream: Open needs a config (the offload tiers)")
	}
	if cfg.FP16 {
		return nil, errors.New("stream: fp16.enabled: a GGUF file's weights keep their stored types (f32, bf16, q8_0, q4_0); remove fp16 from the config")
	}
	if d := cfg.ZeroOptimization.OffloadParam.Device; d != config.OffloadNVMe {
		return nil, fmt.Errorf("stream: zero_optimization.offload_param.device %q: the weights are read in place from the file, which needs the nvme tier (allowed: nvme; max_in_cpu keeps part of them in memory)", d)
	}
	f, err := gguf.Open(path)
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			f.Close()
		}
	}()
	info, err := f.Model()
	if err != nil {
		return nil, err
	}
	c := info.Config
	bind, err := c.Binding(decoder.GGUFNames, "")
	if err != nil {
		return nil, err
	}
	names, err := c.Names(decoder.GGUFNames, "")
	if err != nil {
		return nil, err
	}
	m = &Model{path: path, file: f, info: info, bind: bind, weights: map[string]weight{}, scratch: map[string][]byte{}}
	head := c.Layers // the runtime's last layer
	var descs []tensor.Desc
	for _, n := range names {
		ti, ok := f.Tensor(n.Name)
		if !ok {
			return nil, fmt.Errorf("stream: %s: no tensor %q", path, n.Name)
		}
		typ, err := ti.Type.DType()
		if err != nil || ti.Type == gguf.F16 {
			return nil, fmt.Errorf("stream: %s: tensor %s is %v: streamed weights are read where they lie, in a type the decoder computes on (f32, bf16, q8_0, q4_0); convert the file (f16 to bf16)", path, n.Name, ti.Type)
		}
		if ti.Bytes <= 0 || ti.Bytes%2 != 0 {
			return nil, fmt.Errorf("stream: %s: tensor %s holds %d bytes (a streamed tensor is whole 16-bit words)", path, n.Name, ti.Bytes)
		}
		layer := n.Layer
		switch n.Role {
		case decoder.Embedding:
			m.emb, m.embType = ti, typ
			if m.embRow, err = kernels.RowBytes(typ, c.Dim); err != nil {
				return nil, fmt.Errorf("stream: %s: tensor %s: %w", path, n.Name, err)
			}
			if !c.TiedHead {
				continue // only its rows are read, from the file
			}
			layer = head
		case decoder.EmbedNormScale, decoder.EmbedNormOffset:
			layer = 0 // read before the first layer's pass
		case decoder.FinalNormScale, decoder.FinalNormOffset, decoder.Head:
			layer = head
		}
		m.weights[n.Name] = weight{info: ti, typ: typ, layer: layer}
		descs = append(descs, tensor.Desc{Name: n.Name, Shape: []int{int(ti.Bytes / 2)}, Layer: layer})
	}
	if m.emb == nil {
		return nil, fmt.Errorf("stream: %s: no token embedding", path)
	}
	sort.SliceStable(descs, func(i, j int) bool { return descs[i].Layer < descs[j].Layer })
	for _, d := range descs {
		m.order = append(m.order, d.Name)
	}

	rc := *cfg
	rc.BF16 = true // the runtime's words; the types are the file's
	m.cfg = &rc
	rt, err := zinf.Open(m.cfg, zinf.Model{Tensors: descs, Layers: head + 1}, zinf.Options{Logger: o.Logger, Inference: true, InPlace: true,
		PrefetchDepth: o.PrefetchDepth, NoBandwidthProbe: o.NoBandwidthProbe, PieceBytes: -1})
	if err != nil {
		return nil, err
	}
	m.rt = rt
	defer func() {
		if err != nil {
			rt.Close()
		}
	}()
	if m.rd, err = rt.Reader(); err != nil {
		return nil, err
	}
	for _, name := range m.order {
		w := m.weights[name]
		if err := rt.InitInPlace(ctx, name, path, w.info.Offset, wordType); err != nil {
			return nil, fmt.Errorf("stream: %s: tensor %s: %w", path, name, err)
		}
	}
	// The kept weights are read now, packed in the pool (see
	// zinf.Runtime.WarmCache), not by the first pass.
	if _, err := rt.WarmCache(ctx); err != nil {
		return nil, fmt.Errorf("stream: %s: %w", path, err)
	}
	return m, nil
}

// Config is the decoder's configuration of the model.
func (m *Model) Config() decoder.Config { return m.info.Config }

// ContextLength is the positions the model was trained for.
func (m *Model) ContextLength() int { return m.info.ContextLength }

// File is the GGUF file's header (its metadata and tokenizer).
func (m *Model) File() *gguf.File { return m.file }

// Runtime is the zinf runtime that streams the weights: its plan,
// placement, bandwidth and metrics.
func (m *Model) Runtime() *zinf.Runtime { return m.rt }

// Pass runs one forward pass of d over the new tokens (see
// decoder.Decoder.Begin) and writes each sequence's logits at its last
// new position into logits (batch x vocab values). Each layer is swapped
// in (waiting for it if the prefetch has not brought it yet), computed on
// where it lies, and handed back; the runtime prefetches the layers that
// follow, past the pass's end into the next pass's first ones. Call
// EndPasses after the last pass.
func (m *Model) Pass(ctx context.Context, d *decoder.Decoder, cache *decoder.KVCache, tokens [][]int32, pos []int, logits []float32) error {
	if m.closed {
		return errors.New("stream: the model is closed")
	}
	c := m.info.Config
	m.rt.ForwardRepeating()
	m.passes++
	for l := 0; l <= c.Layers; l++ {
		if err := m.rd.BeginLayer(ctx, l); err != nil {
			return fmt.Errorf("stream: layer %d: %w", l, err)
		}
		m.layer = l
		err := m.runLayer(ctx, d, cache, tokens, pos, logits, l)
		m.release()
		m.rd.EndLayer(l)
		if err != nil {
			return fmt.Errorf("stream: layer %d: %w", l, err)
		}
	}
	return nil
}

func (m *Model) runLayer(ctx context.Context, d *decoder.Decoder, cache *decoder.KVCache, tokens [][]int32, pos []int, logits []float32, l int) error {
	c := m.info.Config
	view := func(name string) (decoder.Tensor, error) { return m.view(ctx, name) }
	if l == c.Layers {
		if err := m.bind.Model(view, &m.mw); err != nil {
			return err
		}
		return d.Logits(&m.mw, logits)
	}
	if l == 0 {
		if err := m.bind.Model(view, &m.mw); err != nil {
			return err
		}
		if err := d.BeginRows(cache, tokens, pos, m.embType, m.embeddingRow, &m.mw); err != nil {
			return err
		}
	}
	if err := m.bind.Layer(l, view, &m.lw); err != nil {
		return err
	}
	return d.Layer(l, &m.lw)
}

// embeddingRow reads token tok's row of the embedding from the file.
func (m *Model) embeddingRow(tok int32, dst []byte) ([]byte, error) {
	off := int64(tok) * int64(m.embRow)
	if tok < 0 || off+int64(m.embRow) > m.emb.Bytes || len(dst) < m.embRow {
		return nil, fmt.Errorf("row %d of %s is outside its %d bytes", tok, m.emb.Name, m.emb.Bytes)
	}
	if _, err := m.file.Section(m.emb).ReadAt(dst[:m.embRow], off); err != nil {
		return nil, fmt.Errorf("reading row %d of %s from %s: %w", tok, m.emb.Name, m.path, err)
	}
	return dst[:m.embRow], nil
}

// view is the decoder's view of weight name in the layer being bound:
// the bytes of its pinned buffer, held until the layer ends, or a copy
// where the runtime holds no single buffer of it. A weight of another
// runtime layer is left empty (Binding.Model asks for the head's weights
// at the first layer and for the embedding norm's at the last).
func (m *Model) view(ctx context.Context, name string) (decoder.Tensor, error) {
	w, ok := m.weights[name]
	if !ok || w.layer != m.layer {
		return decoder.Tensor{}, nil
	}
	data, dt, rel, ok, err := m.rd.View(ctx, name)
	if err != nil {
		return decoder.Tensor{}, err
	}
	if ok {
		if dt != wordType || int64(len(data)) != w.info.Bytes {
			rel()
			return decoder.Tensor{}, fmt.Errorf("the runtime holds %d bytes of %v, want the file's %d", len(data), dt, w.info.Bytes)
		}
		m.held = append(m.held, rel)
		return decoder.Tensor{Type: w.typ, Data: data}, nil
	}
	dst := m.scratch[name]
	if int64(len(dst)) != w.info.Bytes {
		dst = make([]byte, w.info.Bytes)
		m.scratch[name] = dst
	}
	if err := m.rd.Copy(ctx, name, wordType, dst); err != nil {
		return decoder.Tensor{}, err
	}
	return decoder.Tensor{Type: w.typ, Data: dst}, nil
}

func (m *Model) release() {
	for _, rel := range m.held {
		rel()
	}
	m.held = m.held[:0]
}

// EndPasses gives back what the last pass prefetched for a pass that does
// not come.
func (m *Model) EndPasses() {
	if !m.closed {
		m.rt.ReleasePrefetched()
	}
}

// Stats are what streaming the weights did and holds.
type Stats struct {
	// Passes is the passes run; BytesRead the weight bytes read from the
	// file since Open (the kept weights' included); IOWait the time
	// passes waited for weights.
	Passes    int
	BytesRead int64
	IOWait    time.Duration
	// KeptTensors and KeptBytes are the weights the pool holds for good
	// (offload_param.max_in_cpu); StreamedBytes what each pass reads of
	// the others. PinnedBytes is the pool's capacity.
	KeptTensors              int
	KeptBytes, StreamedBytes int64
	PinnedBytes              int64
	// PreemptedBytes are weights read ahead and given back unused to make
	// room for a layer a pass waited for (read again when wanted: a pool
	// too tight for the prefetch window); DemandMisses the layers a pass
	// found not prefetched.
	PreemptedBytes int64
	DemandMisses   int64
	// PrefetchDepth is the layers the runtime reads ahead.
	PrefetchDepth int
}

// Stats returns the model's streaming figures so far.
func (m *Model) Stats() Stats {
	mt := m.rt.Metrics()
	s := Stats{Passes: m.passes, BytesRead: mt.BytesRead, IOWait: mt.IOWait, PinnedBytes: mt.PinnedBytes,
		PreemptedBytes: mt.Params.PreemptedBytes, DemandMisses: mt.Schedule.DemandMisses, PrefetchDepth: m.rt.Placement().PrefetchDepth}
	for _, name := range m.order {
		b := m.weights[name].info.Bytes
		if m.rt.CacheKeeps(name) {
			s.KeptTensors++
			s.KeptBytes += b
		} else {
			s.StreamedBytes += b
		}
	}
	return s
}

// Floor is what a decoding step of batch sequences reaching total
// positions cannot beat, by the plan (plan.ForGeneration): the streamed
// weights at the NVMe read bandwidth the runtime planned with, or the
// step's compute — measured by the caller on this model (a step's time
// less its wait for weights), the kept weights read from memory included
// — whichever is longer. The KV cache is the decoder's, in memory.
func (m *Model) Floor(batch, total int, compute time.Duration) (plan.Generation, error) {
	c := m.info.Config
	kvh := c.KVHeads
	if kvh == 0 {
		kvh = c.Heads
	}
	kv := int64(2 * kvh * c.HeadDim * 4 * total)
	cfg := *m.cfg
	cfg.Zinf.KVCache.Device = config.KVCacheMemory
	return plan.ForGeneration(&cfg, m.rt.Bandwidth(), plan.GenerationInput{Layers: c.Layers, WeightBytes: m.Stats().StreamedBytes,
		KVBytesPerSequence: kv, ComputeFixed: compute, MaxBatch: batch})
}

// Close ends the runtime and closes the file.
func (m *Model) Close() error {
	if m.closed {
		return nil
	}
	m.closed = true
	m.release()
	return errors.Join(m.rt.Close(), m.file.Close())
}

package decoder

import (
	"errors"
	"fmt"
	"math"

	"github.com/zinfio/zinf/decoder/kernels"
)

// KVCache holds the keys and values of every layer and position of a
// batch of sequences in memory the caller provides: k and v each hold
// Layers x Batch x MaxLen x KVHeads x HeadDim float32 values, in that
// order (row-major), the keys after RoPE. The caller may read them (to
// move a sequence's entries to another tier, say) between passes.
type KVCache struct {
	// lk and lv are each layer's keys and values (Batch x MaxLen x
	// KVHeads x HeadDim values), nil for a layer not bound.
	lk, lv         [][]float32
	batch, maxLen  int
	layers, stride int // stride: values of one sequence in one layer
	kvDim          int
}

// Batch returns the sequences the cache holds.
func (kv *KVCache) Batch() int { return kv.batch }

// MaxLen returns the positions the cache holds for each sequence.
func (kv *KVCache) MaxLen() int { return kv.maxLen }

// NewKVCache checks k and v against the configuration and wraps them.
func NewKVCache(c Config, batch, maxLen int, k, v []float32) (*KVCache, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	if batch < 1 || batch > maxSize {
		return nil, fmt.Errorf("decoder: KV cache batch %d is outside 1..%d", batch, maxSize)
	}
	if maxLen < 1 || maxLen > MaxCacheLen {
		return nil, fmt.Errorf("decoder: KV cache length %d is outside 1..%d", maxLen, MaxCacheLen)
	}
	kvDim := c.kvHeads() * c.HeadDim
	n, ok := mulBounded(c.Layers, batch, maxLen, kvDim)
	if !ok {
		return nil, fmt.Errorf("decoder: KV cache of layers %d x batch %d x length %d x kv-heads %d x head-dim %d values is above %d", c.Layers, batch, maxLen, c.kvHeads(), c.HeadDim, math.MaxInt/2)
	}
	if len(k) != n || len(v) != n {
		return nil, fmt.Errorf("decoder: KV cache K has %d values and V %d, want layers %d x batch %d x length %d x kv-heads %d x head-dim %d = %d each",
			len(k), len(v), c.Layers, batch, maxLen, c.kvHeads(), c.HeadDim, n)
	}
	kv := &KVCache{lk: make([][]float32, c.Layers), lv: make([][]float32, c.Layers), batch: batch, maxLen: maxLen, layers: c.Layers, stride: maxLen * kvDim, kvDim: kvDim}
	per := n / c.Layers
	for l := range c.Layers {
		kv.lk[l], kv.lv[l] = k[l*per:(l+1)*per:(l+1)*per], v[l*per:(l+1)*per:(l+1)*per]
	}
	return kv, nil
}

// NewLayerKVCache returns a KV cache for batch sequences of maxLen
// positions whose layers' keys and values the caller binds a layer at a
// time (BindLayer) before the layer runs: for a cache on a tier that
// hands out one layer's entry at a time (zinf's KV cache on NVMe). A
// layer's entry holds LayerValues() keys, then as many values, in
// NewKVCache's layout less its layer dimension.
func NewLayerKVCache(c Config, batch, maxLen int) (*KVCache, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	if batch < 1 || batch > maxSize {
		return nil, fmt.Errorf("decoder: KV cache batch %d is outside 1..%d", batch, maxSize)
	}
	if maxLen < 1 || maxLen > MaxCacheLen {
		return nil, fmt.Errorf("decoder: KV cache length %d is outside 1..%d", maxLen, MaxCacheLen)
	}
	kvDim := c.kvHeads() * c.HeadDim
	if _, ok := mulBounded(c.Layers, batch, maxLen, kvDim); !ok {
		return nil, fmt.Errorf("decoder: KV cache of layers %d x batch %d x length %d x kv-heads %d x head-dim %d values is above %d", c.Layers, batch, maxLen, c.kvHeads(), c.HeadDim, math.MaxInt/2)
	}
	return &KVCache{lk: make([][]float32, c.Layers), lv: make([][]float32, c.Layers), batch: batch, maxLen: maxLen, layers: c.Layers, stride: maxLen * kvDim, kvDim: kvDim}, nil
}

// LayerValues returns the number of keys (and of values) of one layer:
// Batch x MaxLen x KVHeads x HeadDim.
func (kv *KVCache) LayerValues() int { return kv.batch * kv.stride }

// BindLayer makes k and v (LayerValues() values each) layer l's keys and
// values from now on: the cache reads and writes them when the layer
// runs. nil for both unbinds the layer (a Layer call on it is then an
// error); the caller keeps them valid while bound.
func (kv *KVCache) BindLayer(l int, k, v []float32) error {
	if l < 0 || l >= kv.layers {
		return fmt.Errorf("decoder: BindLayer: layer %d is outside 0..%d", l, kv.layers-1)
	}
	if k == nil && v == nil {
		kv.lk[l], kv.lv[l] = nil, nil
		return nil
	}
	if n := kv.LayerValues(); len(k) != n || len(v) != n {
		return fmt.Errorf("decoder: BindLayer(%d): K has %d values and V %d, want batch %d x length %d x kv-heads x head-dim %d = %d each", l, len(k), len(v), kv.batch, kv.maxLen, kv.kvDim, n)
	}
	kv.lk[l], kv.lv[l] = k, v
	return nil
}

// mulBounded returns the product of the factors (each at least 1) and
// whether it stays below math.MaxInt/2.
func mulBounded(f ...int) (int, bool) {
	p := 1
	for _, x := range f {
		if x < 1 || p > math.MaxInt/2/x {
			return 0, false
		}
		p *= x
	}
	return p, true
}

// Decoder computes a model's forward pass over weights handed to it layer
// by layer. It holds the activations of the pass in progress; a Decoder is
// not safe for concurrent use (use one per goroutine; they may share a
// kernels.Pool, which serializes products).
type Decoder struct {
	c    Config
	pool *kernels.Pool
	freq []float32 // RoPE's inverse frequencies, one per rotated pair

	// The pass in progress.
	cache  *KVCache
	batch  int
	steps  int   // new tokens per sequence
	pos    []int // the first new position of each sequence
	next   int   // the next layer Layer expects; Layers once all ran
	active bool

	// Scratch, grown on demand and kept.
	x, h, q, k, v, o, a, f, g, vec, vec2 []float32
	row                                  []byte     // BeginRows' embedding row
	attnWork                             []attnWork // one per worker
	workers                              int        // goroutines attention is split over
	// shared holds the products of one linears call; sharedW and sharedY
	// the matrices and outputs it hands kernels.Pool.MatMuls (kept, so
	// that a step allocates nothing).
	shared  [kernels.MaxShared]linPart
	sharedW [kernels.MaxShared]kernels.Matrix
	sharedY [kernels.MaxShared][]float32
	// attention's split in progress, read by attnChunk (d.attnChunkOf,
	// made once in New).
	attnChunk                     func(int)
	attnL, attnPairs, attnWorkers int
	// the activation's split in progress, read by actChunk.
	actChunk         func(int)
	actN, actWorkers int
	actGated         bool
}

// New returns a decoder of the model c whose products run on pool (nil:
// kernels.MatMul's shared pool).
func New(c Config, pool *kernels.Pool) (*Decoder, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	d := &Decoder{c: c, pool: pool}
	if pool != nil {
		d.workers = pool.Workers()
	} else {
		d.workers = kernels.DefaultWorkers()
	}
	d.attnChunk = d.attnChunkOf
	d.actChunk = d.actChunkOf
	if r := c.ropeDims(); r > 0 {
		// As the zoo computes them, in float32: base^(2i/r), then its
		// reciprocal.
		base := float32(c.RoPEBase)
		for i := range r / 2 {
			e := float32(i) * float32(2.0/float64(r))
			d.freq = append(d.freq, 1/float32(math.Pow(float64(base), float64(e))))
		}
	}
	return d, nil
}

// Config returns the decoder's configuration.
func (d *Decoder) Config() Config { return d.c }

// grow returns s with length n, reusing its memory.
func grow8(s []byte, n int) []byte {
	if cap(s) < n {
		return make([]byte, n)
	}
	return s[:n]
}

func grow(s []float32, n int) []float32 {
	if cap(s) < n {
		return make([]float32, n)
	}
	return s[:n]
}

// Begin starts a forward pass over the new tokens of each sequence of the
// cache's batch: tokens[b] holds the same number of tokens for every
// sequence (one for a decoding step, the prompt for a prefill), at
// positions pos[b], pos[b]+1, ... of the cache; the cache's earlier
// positions of the sequence must hold its keys and values. The pass reads
// the token embeddings from w.Embedding (and w's embedding norm); Layer
// then runs the layers in order and Logits ends the pass.
func (d *Decoder) Begin(cache *KVCache, tokens [][]int32, pos []int, w *ModelWeights) error {
	c := &d.c
	d.active = false
	if err := checkType("Embedding", w.Embedding.Type, OutIn); err != nil {
		return err
	}
	rb, err := kernels.RowBytes(w.Embedding.Type, c.Dim)
	if err != nil {
		return fmt.Errorf("decoder: weight Embedding: %w", err)
	}
	if rb == 0 || len(w.Embedding.Data)/rb < c.Vocab || len(w.Embedding.Data) != c.Vocab*rb {
		return fmt.Errorf("decoder: weight Embedding: %d bytes, want vocab %d x %d bytes a row of %d %v values", len(w.Embedding.Data), c.Vocab, rb, c.Dim, w.Embedding.Type)
	}
	return d.begin(cache, tokens, pos, w.Embedding.Type, w.Embedding.Data, nil, w)
}

// EmbeddingRow returns the stored bytes of token tok's row of the token
// embedding (RowBytes of the embedding's type and Dim of them): a view of
// a table, or the row read into scratch (len(scratch) is the row's bytes)
// from where the table lies, for a caller that does not hold the whole
// table in memory (a streamed model reads only the rows of its tokens).
type EmbeddingRow func(tok int32, scratch []byte) ([]byte, error)

// BeginRows starts a pass as Begin does, with the token embeddings read
// row by row through row (the embedding's rows stored in type typ) rather
// than from w.Embedding, which may then be empty (w's embedding norm is
// still read; Logits reads w.Embedding with TiedHead).
func (d *Decoder) BeginRows(cache *KVCache, tokens [][]int32, pos []int, typ kernels.DType, row EmbeddingRow, w *ModelWeights) error {
	d.active = false
	if err := checkType("Embedding", typ, OutIn); err != nil {
		return err
	}
	if row == nil {
		return errors.New("decoder: BeginRows needs a row reader")
	}
	return d.begin(cache, tokens, pos, typ, nil, row, w)
}

// begin is Begin (the rows from table) and BeginRows (from rowOf).
func (d *Decoder) begin(cache *KVCache, tokens [][]int32, pos []int, typ kernels.DType, table []byte, rowOf EmbeddingRow, w *ModelWeights) error {
	c := &d.c
	if cache == nil || cache.layers != c.Layers || cache.kvDim != c.kvHeads()*c.HeadDim {
		return errors.New("decoder: Begin needs a KV cache made by NewKVCache for this configuration")
	}
	if len(tokens) != cache.batch || len(pos) != cache.batch {
		return fmt.Errorf("decoder: %d sequences of tokens and %d positions for a KV cache of batch %d (want one each per sequence)", len(tokens), len(pos), cache.batch)
	}
	steps := len(tokens[0])
	for b := range tokens {
		if len(tokens[b]) != steps || steps == 0 {
			return fmt.Errorf("decoder: sequence %d has %d new tokens, sequence 0 %d (want the same count, at least 1, for every sequence)", b, len(tokens[b]), steps)
		}
		if pos[b] < 0 || pos[b] > cache.maxLen-steps {
			return fmt.Errorf("decoder: sequence %d: %d new tokens at position %d do not fit a KV cache of %d positions", b, steps, pos[b], cache.maxLen)
		}
		for _, t := range tokens[b] {
			if t < 0 || int(t) >= c.Vocab {
				return fmt.Errorf("decoder: sequence %d: token %d is outside 0..%d (the vocabulary)", b, t, c.Vocab-1)
			}
		}
	}
	rb, err := kernels.RowBytes(typ, c.Dim)
	if err != nil {
		return fmt.Errorf("decoder: weight Embedding: %w", err)
	}
	if rowOf != nil {
		d.row = grow8(d.row, rb)
	}
	n := cache.batch * steps
	d.x = grow(d.x, n*c.Dim)
	scale := float32(1)
	if c.EmbedScale {
		scale = float32(math.Sqrt(float64(c.Dim)))
	}
	for b := range tokens {
		for t, tok := range tokens[b] {
			row := d.x[(b*steps+t)*c.Dim:][:c.Dim]
			var src []byte
			if rowOf == nil {
				src = table[int(tok)*rb:][:rb]
			} else if src, err = rowOf(tok, d.row); err != nil {
				return fmt.Errorf("decoder: weight Embedding: token %d: %w", tok, err)
			}
			if len(src) < rb {
				return fmt.Errorf("decoder: weight Embedding: token %d: a row of %d bytes, want %d", tok, len(src), rb)
			}
			if err := kernels.Dequantize(row, typ, src[:rb]); err != nil {
				return fmt.Errorf("decoder: weight Embedding: %w", err)
			}
			if c.EmbedScale {
				for i := range row {
					row[i] *= scale
				}
			}
		}
	}
	if err := d.norm(d.x, n, c.EmbedNorm, "EmbedNorm", w.EmbedNormScale, w.EmbedNormOffset); err != nil {
		return err
	}
	d.cache, d.batch, d.steps, d.next, d.active = cache, cache.batch, steps, 0, true
	d.pos = append(d.pos[:0], pos...)
	return nil
}

// Layer runs transformer layer l (0-based; layers run in order, each once a
// pass) on the weights w: it reads them during the call only.
func (d *Decoder) Layer(l int, w *LayerWeights) error {
	c := &d.c
	if !d.active {
		return errors.New("decoder: Layer outside a pass (call Begin first)")
	}
	if l != d.next {
		return fmt.Errorf("decoder: Layer %d, want layer %d next (layers run in order, 0..%d)", l, d.next, c.Layers-1)
	}
	if err := d.layer(l, w); err != nil {
		d.active = false
		return fmt.Errorf("decoder: layer %d: %w", l, err)
	}
	d.next++
	return nil
}

// Logits ends the pass: the final norm and the head on the last new
// position of each sequence, written to out (Batch x Vocab values). With
// TiedHead the head is w.Embedding.
func (d *Decoder) Logits(w *ModelWeights, out []float32) error {
	c := &d.c
	if !d.active || d.next != c.Layers {
		return fmt.Errorf("decoder: Logits before the pass ran its %d layers (%d ran)", c.Layers, d.next)
	}
	if len(out) != d.batch*c.Vocab {
		return fmt.Errorf("decoder: Logits: out has %d values, want batch %d x vocab %d", len(out), d.batch, c.Vocab)
	}
	d.active = false
	d.h = grow(d.h, d.batch*c.Dim)
	for b := range d.batch {
		copy(d.h[b*c.Dim:][:c.Dim], d.x[(b*d.steps+d.steps-1)*c.Dim:][:c.Dim])
	}
	if err := d.norm(d.h, d.batch, c.FinalNorm, "FinalNorm", w.FinalNormScale, w.FinalNormOffset); err != nil {
		return err
	}
	head, layout := w.Head, c.HeadLayout
	if c.TiedHead {
		head, layout = w.Embedding, OutIn
	}
	return d.linear(out, "Head", head, layout, c.Vocab, c.Dim, d.h, d.batch, nil)
}

// layer is one transformer layer on d.x (n = batch x steps rows).
func (d *Decoder) layer(l int, w *LayerWeights) error {
	c := &d.c
	n := d.batch * d.steps
	dim, hd, heads, kvh := c.Dim, c.HeadDim, c.Heads, c.kvHeads()
	qDim, kvDim := heads*hd, kvh*hd
	d.h = grow(d.h, n*dim)
	copy(d.h, d.x[:n*dim])
	if c.Block != PostNorm {
		if err := d.norm(d.h, n, c.Norm, "AttnNorm", w[AttnNorm], w[AttnNormOffset]); err != nil {
			return err
		}
	}
	d.q, d.k, d.v = grow(d.q, n*qDim), grow(d.k, n*kvDim), grow(d.v, n*kvDim)
	var qb, kb, vb *Tensor
	if c.QKVBias {
		qb, kb, vb = &w[QueryBias], &w[KeyBias], &w[ValueBias]
	}
	d.shared[0] = linPart{d.q, "Query", w[Query], qDim, qb}
	d.shared[1] = linPart{d.k, "Key", w[Key], kvDim, kb}
	d.shared[2] = linPart{d.v, "Value", w[Value], kvDim, vb}
	if err := d.linears(d.shared[:3], c.Layout, dim, d.h, n); err != nil {
		return err
	}
	// RoPE on the new queries and keys, then the keys and values into the
	// cache.
	cache := d.cache
	if cache.lk[l] == nil {
		return fmt.Errorf("the KV cache's layer %d is not bound (KVCache.BindLayer)", l)
	}
	for b := range d.batch {
		for t := range d.steps {
			r, p := b*d.steps+t, d.pos[b]+t
			d.rope(d.q[r*qDim:][:qDim], heads, p)
			d.rope(d.k[r*kvDim:][:kvDim], kvh, p)
			off := b*cache.stride + p*kvDim
			copy(cache.lk[l][off:off+kvDim], d.k[r*kvDim:])
			copy(cache.lv[l][off:off+kvDim], d.v[r*kvDim:])
		}
	}
	d.o = grow(d.o, n*qDim)
	if err := d.attention(l); err != nil {
		return err
	}
	d.a = grow(d.a, n*dim)
	var ob *Tensor
	if c.OutBias {
		ob = &w[OutBias]
	}
	if err := d.linear(d.a, "Out", w[Out], c.Layout, dim, qDim, d.o, n, ob); err != nil {
		return err
	}
	if c.Block == Sandwich {
		if err := d.norm(d.a, n, c.Norm, "PostAttnNorm", w[PostAttnNorm], w[PostAttnNormOffset]); err != nil {
			return err
		}
	}
	for i := range n * dim {
		d.x[i] += d.a[i]
	}
	if c.Block == PostNorm {
		if err := d.norm(d.x, n, c.Norm, "AttnNorm", w[AttnNorm], w[AttnNormOffset]); err != nil {
			return err
		}
	}

	// The feed-forward network.
	copy(d.h, d.x[:n*dim])
	if c.Block != PostNorm {
		if err := d.norm(d.h, n, c.Norm, "FFNNorm", w[FFNNorm], w[FFNNormOffset]); err != nil {
			return err
		}
	}
	F := c.FFNDim
	bias := func(r Role) *Tensor {
		if c.FFNBias {
			return &w[r]
		}
		return nil
	}
	d.f = grow(d.f, n*F)
	switch {
	case c.FusedGateUp:
		d.g = grow(d.g, n*2*F)
		if err := d.linear(d.g, "Up", w[Up], c.Layout, 2*F, dim, d.h, n, bias(UpBias)); err != nil {
			return err
		}
		for r := range n {
			gu := d.g[r*2*F:][:2*F]
			fr := d.f[r*F:][:F]
			for i := range fr {
				fr[i] = act(c.Activation, gu[i]) * gu[F+i]
			}
		}
	case c.Gated:
		d.g = grow(d.g, n*F)
		d.shared[0] = linPart{d.g, "Gate", w[Gate], F, bias(GateBias)}
		d.shared[1] = linPart{d.f, "Up", w[Up], F, bias(UpBias)}
		if err := d.linears(d.shared[:2], c.Layout, dim, d.h, n); err != nil {
			return err
		}
		if err := d.activate(n*F, true); err != nil {
			return err
		}
	default:
		if err := d.linear(d.f, "Up", w[Up], c.Layout, F, dim, d.h, n, bias(UpBias)); err != nil {
			return err
		}
		if err := d.activate(n*F, false); err != nil {
			return err
		}
	}
	if err := d.linear(d.a, "Down", w[Down], c.Layout, dim, F, d.f, n, bias(DownBias)); err != nil {
		return err
	}
	if c.Block == Sandwich {
		if err := d.norm(d.a, n, c.Norm, "PostFFNNorm", w[PostFFNNorm], w[PostFFNNormOffset]); err != nil {
			return err
		}
	}
	for i := range n * dim {
		d.x[i] += d.a[i]
	}
	if c.Block == PostNorm {
		if err := d.norm(d.x, n, c.Norm, "FFNNorm", w[FFNNorm], w[FFNNormOffset]); err != nil {
			return err
		}
	}
	return nil
}

// rope rotates the first ropeDims dimensions of each of the heads of x at
// position p, pairing (i, i+r/2), or (2i, 2i+1) when interleaved.
func (d *Decoder) rope(x []float32, heads, p int) {
	r := len(d.freq) * 2
	if r == 0 {
		return
	}
	hd := d.c.HeadDim
	half := r / 2
	for i, f := range d.freq {
		// float32 angles, as the zoo computes them.
		ang := float64(float32(p) * f)
		cs, sn := float32(math.Cos(ang)), float32(math.Sin(ang))
		for h := range heads {
			v := x[h*hd:]
			i1, i2 := i, i+half
			if d.c.RoPEInterleaved {
				i1, i2 = 2*i, 2*i+1
			}
			x1, x2 := v[i1], v[i2]
			v[i1] = x1*cs - x2*sn
			v[i2] = x1*sn + x2*cs
		}
	}
}

// attention computes d.o from d.q and layer l's cache: causal softmax
// attention of each new position over the sequence's positions up to it,
// query head h reading key/value head h / (Heads / KVHeads). The (row,
// head) pairs are split into contiguous ranges over the kernels pool's
// workers (Pool.Parallel: no goroutine started, nothing allocated) when
// there is enough work; each pair is computed the same way whatever the
// split, so the bits do not depend on it.
func (d *Decoder) attention(l int) error {
	c := &d.c
	pairs := d.batch * d.steps * c.Heads
	work := 0 // multiply-adds, about
	for b := range d.batch {
		work += d.steps * (d.pos[b] + d.steps) * c.Heads * c.HeadDim * 2
	}
	workers := min(d.workers, pairs, max(1, work/minAttnWork))
	for len(d.attnWork) < workers {
		d.attnWork = append(d.attnWork, attnWork{})
	}
	if workers <= 1 {
		return d.attend(l, 0, pairs, &d.attnWork[0])
	}
	d.attnL, d.attnPairs, d.attnWorkers = l, pairs, workers
	var err error
	if d.pool != nil {
		err = d.pool.Parallel(workers, d.attnChunk)
	} else {
		err = kernels.Parallel(workers, d.attnChunk)
	}
	for w := range workers {
		if err == nil {
			err = d.attnWork[w].err
		}
		d.attnWork[w].err = nil
	}
	return err
}

// attnChunkOf is chunk w of attention's pairs (d.attnL, d.attnPairs,
// d.attnWorkers): a function made once, so that the fan-out on the
// kernels' pool allocates nothing.
func (d *Decoder) attnChunkOf(w int) {
	lo, hi := d.attnPairs*w/d.attnWorkers, d.attnPairs*(w+1)/d.attnWorkers
	d.attnWork[w].err = d.attend(d.attnL, lo, hi, &d.attnWork[w])
}

// activate sets d.f[i] to act(d.f[i]), or when gated to act(d.g[i]) *
// d.f[i], for i < n, split over the kernels pool's workers when there
// are enough values: the
// activation (an exponential in float64 for SiLU) cost a layer of the
// 400 M llama about as much as one of its smaller products. Each value
// is computed the same way whatever the split.
func (d *Decoder) activate(n int, gated bool) error {
	workers := min(d.workers, max(1, n/minActValues))
	d.actN, d.actWorkers, d.actGated = n, workers, gated
	if workers <= 1 {
		d.actChunkOf(0)
		return nil
	}
	if d.pool != nil {
		return d.pool.Parallel(workers, d.actChunk)
	}
	return kernels.Parallel(workers, d.actChunk)
}

// actChunkOf is chunk w of activate's values.
func (d *Decoder) actChunkOf(w int) {
	lo, hi := d.actN*w/d.actWorkers, d.actN*(w+1)/d.actWorkers
	a, f := d.c.Activation, d.f[lo:hi]
	if d.actGated {
		g := d.g[lo:hi]
		for i := range f {
			f[i] = act(a, g[i]) * f[i]
		}
		return
	}
	for i := range f {
		f[i] = act(a, f[i])
	}
}

// minActValues is the activations below which another goroutine costs
// more than it saves.
const minActValues = 1024

// minAttnWork is the multiply-adds below which another goroutine costs
// more than it saves.
const minAttnWork = 1 << 16

// attend computes the (row, head) pairs lo..hi-1 of attention with the
// worker's scratch aw: the scores and the weighted sum of the values on
// the kernels' strided products (kernels.Dots, kernels.WeightedSum: the
// bits of MatMul and MatMulInOut, whatever the kernel), the softmax in
// between in Go.
func (d *Decoder) attend(l, lo, hi int, aw *attnWork) error {
	c := &d.c
	hd, heads, kvh := c.HeadDim, c.Heads, c.kvHeads()
	group := heads / kvh
	qDim, kvDim := heads*hd, kvh*hd
	scale := float32(1 / math.Sqrt(float64(hd)))
	cache := d.cache
	for pair := lo; pair < hi; pair++ {
		r, h := pair/heads, pair%heads
		b, t := r/d.steps, r%d.steps
		p := d.pos[b] + t
		base := b * cache.stride
		K, V := cache.lk[l][base:base+cache.stride], cache.lv[l][base:base+cache.stride]
		aw.s = grow(aw.s, p+1)
		s := aw.s
		q := d.q[r*qDim+h*hd:][:hd]
		ko := (h / group) * hd
		// The scores: the query times each position's key of its kv
		// head (a position's keys kvDim values apart), on the kernels.
		if err := kernels.Dots(s, K[ko:], kvDim, p+1, hd, q, &aw.sc); err != nil {
			return err
		}
		m := float32(math.Inf(-1))
		for j := range s {
			s[j] *= scale
			m = max(m, s[j])
		}
		var sum float32
		for j := range s {
			s[j] = float32(math.Exp(float64(s[j] - m)))
			sum += s[j]
		}
		inv := 1 / sum
		for j := range s {
			s[j] *= inv
		}
		// The output: the values weighted by the probabilities.
		if err := kernels.WeightedSum(d.o[r*qDim+h*hd:][:hd], V[ko:], kvDim, p+1, hd, s); err != nil {
			return err
		}
	}
	return nil
}

// attnWork is one attention worker's scratch and error.
type attnWork struct {
	s   []float32 // the scores of one (row, head) pair
	sc  kernels.Scratch
	err error
}

// act applies the activation.
func act(a Activation, x float32) float32 {
	switch a {
	case SiLU:
		return x / (1 + float32(math.Exp(float64(-x))))
	case GELU:
		return float32(0.5 * float64(x) * (1 + math.Erf(float64(x)/math.Sqrt2)))
	case GELUTanh:
		xf := float64(x)
		return float32(0.5 * xf * (1 + math.Tanh(math.Sqrt(2/math.Pi)*(xf+0.044715*xf*xf*xf))))
	case ReLU:
		return max(x, 0)
	}
	return x
}

// vector widens a vector weight (a norm's scale, a bias) of n values into
// dst. The weight is named name and part ("AttnNorm", "scale"), joined
// only for an error: a decoding step allocates nothing.
func vector(dst []float32, name, part string, t Tensor, n int) ([]float32, error) {
	dst = grow(dst, n)
	if t.Data == nil {
		return nil, fmt.Errorf("weight %s %s is missing (want %d f32 or bf16 values)", name, part, n)
	}
	if t.Type != kernels.F32 && t.Type != kernels.BF16 {
		return nil, fmt.Errorf("weight %s %s: type %v (allowed for vectors: f32, bf16)", name, part, t.Type)
	}
	rb, _ := kernels.RowBytes(t.Type, n)
	if len(t.Data) != rb {
		return nil, fmt.Errorf("weight %s %s: %d bytes, want %d %v values (%d bytes)", name, part, len(t.Data), n, t.Type, rb)
	}
	if err := kernels.Dequantize(dst, t.Type, t.Data); err != nil {
		return nil, fmt.Errorf("weight %s %s: %w", name, part, err)
	}
	return dst, nil
}

// norm normalizes the n rows of x (Dim values each) in place.
func (d *Decoder) norm(x []float32, n int, kind Norm, name string, scale, offset Tensor) error {
	if kind == NoNorm {
		return nil
	}
	dim := d.c.Dim
	var err error
	if d.vec, err = vector(d.vec, name, "scale", scale, dim); err != nil {
		return err
	}
	g := d.vec
	switch kind {
	case RMSNorm:
		off := float32(d.c.NormScaleOffset)
		eps := float32(d.c.NormEps)
		for r := range n {
			row := x[r*dim:][:dim]
			var ss float32
			for _, v := range row {
				ss += v * v
			}
			rms := float32(math.Sqrt(float64(ss/float32(dim) + eps)))
			for i := range row {
				row[i] = row[i] / rms * (g[i] + off)
			}
		}
	case LayerNorm:
		if d.vec2, err = vector(d.vec2, name, "offset", offset, dim); err != nil {
			return err
		}
		beta := d.vec2
		eps := float32(d.c.NormEps)
		for r := range n {
			row := x[r*dim:][:dim]
			var mean float32
			for _, v := range row {
				mean += v
			}
			mean /= float32(dim)
			var vr float32
			for _, v := range row {
				vr += (v - mean) * (v - mean)
			}
			vr /= float32(dim)
			den := float32(math.Sqrt(float64(vr + eps)))
			for i := range row {
				row[i] = (row[i]-mean)/den*g[i] + beta[i]
			}
		}
	}
	return nil
}

// linear computes y = W x (+ bias) for the n rows of x (cols values each)
// into y (n x rows values): on decoder/kernels for OutIn, MaxBatch rows at
// a time; on inOut for InOut.
func (d *Decoder) linear(y []float32, name string, w Tensor, layout Layout, rows, cols int, x []float32, n int, bias *Tensor) error {
	if w.Data == nil && rows > 0 && cols > 0 {
		return fmt.Errorf("weight %s is missing (want %d x %d values)", name, rows, cols)
	}
	err := checkType(name, w.Type, layout)
	if err != nil {
		return err
	}
	if layout == OutIn {
		m := kernels.Matrix{Type: w.Type, Rows: rows, Cols: cols, Data: w.Data}
		for r0 := 0; r0 < n; r0 += kernels.MaxBatch {
			bn := min(kernels.MaxBatch, n-r0)
			var err error
			if d.pool != nil {
				err = d.pool.MatMul(y[r0*rows:(r0+bn)*rows], m, x[r0*cols:(r0+bn)*cols], bn)
			} else {
				err = kernels.MatMul(y[r0*rows:(r0+bn)*rows], m, x[r0*cols:(r0+bn)*cols], bn)
			}
			if err != nil {
				return fmt.Errorf("weight %s (%d x %d, out-in): %w", name, rows, cols, err)
			}
		}
	} else if err = d.inOut(y[:n*rows], w, rows, cols, x[:n*cols], n); err != nil {
		return fmt.Errorf("weight %s (%d x %d, in-out): %w", name, cols, rows, err)
	}
	if bias == nil {
		return nil
	}
	if d.vec2, err = vector(d.vec2, name, "bias", *bias, rows); err != nil {
		return err
	}
	for r := range n {
		yr := y[r*rows:][:rows]
		for i, b := range d.vec2 {
			yr[i] += b
		}
	}
	return nil
}

// linPart is one product of a linears call: y = W x (+ bias), W of rows
// x the call's cols, named name.
type linPart struct {
	y    []float32
	name string
	w    Tensor
	rows int
	bias *Tensor
}

// linears computes the products ps, which share their input x (n rows of
// cols values): for OutIn weights in one kernels.Pool.MatMuls call a
// MaxBatch rows of x (one split over the workers for them all, the bits
// of a product each), for InOut one linear each.
func (d *Decoder) linears(ps []linPart, layout Layout, cols int, x []float32, n int) error {
	if layout != OutIn || len(ps) == 1 {
		for i := range ps {
			p := &ps[i]
			if err := d.linear(p.y, p.name, p.w, layout, p.rows, cols, x, n, p.bias); err != nil {
				return err
			}
		}
		return nil
	}
	// Drop the references to the weights and outputs at the end: a
	// layer's weights are read during its call only.
	defer clear(ps)
	for i := range ps {
		p := &ps[i]
		if p.w.Data == nil && p.rows > 0 && cols > 0 {
			return fmt.Errorf("weight %s is missing (want %d x %d values)", p.name, p.rows, cols)
		}
		if err := checkType(p.name, p.w.Type, layout); err != nil {
			return err
		}
		d.sharedW[i] = kernels.Matrix{Type: p.w.Type, Rows: p.rows, Cols: cols, Data: p.w.Data}
	}
	ws, ys := d.sharedW[:len(ps)], d.sharedY[:len(ps)]
	for r0 := 0; r0 < n; r0 += kernels.MaxBatch {
		bn := min(kernels.MaxBatch, n-r0)
		for i := range ps {
			ys[i] = ps[i].y[r0*ps[i].rows : (r0+bn)*ps[i].rows]
		}
		xb := x[r0*cols : (r0+bn)*cols]
		var err error
		if d.pool != nil {
			err = d.pool.MatMuls(ys, ws, xb, bn)
		} else {
			err = kernels.MatMuls(ys, ws, xb, bn)
		}
		if err != nil {
			for i := range ps {
				// Name the weight whose shape is wrong.
				if rb, e := kernels.RowBytes(ws[i].Type, cols); e != nil || ws[i].Rows*rb != len(ws[i].Data) {
					return fmt.Errorf("weight %s (%d x %d, out-in): %w", ps[i].name, ps[i].rows, cols, err)
				}
			}
			return fmt.Errorf("weights %s..%s (out-in): %w", ps[0].name, ps[len(ps)-1].name, err)
		}
	}
	clear(ys)
	clear(ws)
	var err error
	for i := range ps {
		p := &ps[i]
		if p.bias == nil {
			continue
		}
		if d.vec2, err = vector(d.vec2, p.name, "bias", *p.bias, p.rows); err != nil {
			return err
		}
		for r := range n {
			yr := p.y[r*p.rows:][:p.rows]
			for i, b := range d.vec2 {
				yr[i] += b
			}
		}
	}
	return nil
}

// inOut computes y[b][o] = sum over i of x[b][i] * W[i][o] for a weight
// stored in features by out features (F32 or BF16) on the kernels'
// in-out products (kernels.Pool.MatMulInOut), MaxBatch rows of x at a
// time: each weight row is read once for those rows, broadcast times the
// row into many outputs' sums at once, the outputs split by column ranges
// over the workers; every output's sum takes the rows in increasing
// order, whatever the split.
func (d *Decoder) inOut(y []float32, w Tensor, outs, ins int, x []float32, n int) error {
	m := kernels.Matrix{Type: w.Type, Rows: ins, Cols: outs, Data: w.Data}
	for r0 := 0; r0 < n; r0 += kernels.MaxBatch {
		bn := min(kernels.MaxBatch, n-r0)
		yb, xb := y[r0*outs:(r0+bn)*outs], x[r0*ins:(r0+bn)*ins]
		var err error
		if d.pool != nil {
			err = d.pool.MatMulInOut(yb, m, xb, bn)
		} else {
			err = kernels.MatMulInOut(yb, m, xb, bn)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

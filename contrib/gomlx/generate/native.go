package generate

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"strings"
	"time"
	"unsafe"

	"github.com/gomlx/compute/dtypes"
	"github.com/gomlx/gomlx/ml/zoo/transformer/generate/sample"

	"github.com/zinfio/zinf"
	"github.com/zinfio/zinf/config"
	"github.com/zinfio/zinf/contrib/gomlx/nativecheck"
	"github.com/zinfio/zinf/decoder"
	"github.com/zinfio/zinf/decoder/kernels"
	"github.com/zinfio/zinf/plan"
	"github.com/zinfio/zinf/tensor"
)

// The values of Options.Decoder.
const (
	// DecoderAuto runs a generation on the native decoder when it covers
	// the model and the generation, and on the GoMLX graphs otherwise.
	DecoderAuto = "auto"
	// DecoderNative runs every generation on the native decoder; Open
	// fails for a model it does not cover, Generate for a generation.
	DecoderNative = "native"
	// DecoderGoMLX runs every generation on the GoMLX graphs.
	DecoderGoMLX = "gomlx"
)

// ParseDecoder checks a decoder path's name ("" is DecoderAuto).
func ParseDecoder(s string) (string, error) {
	switch s {
	case "", DecoderAuto:
		return DecoderAuto, nil
	case DecoderNative, DecoderGoMLX:
		return s, nil
	}
	return "", fmt.Errorf("zinf generate: decoder %q (allowed: auto, native, gomlx)", s)
}

// native is a Generator's native decoder: zinf's decoder package computing
// each layer straight from the bytes zinf swapped into its pinned buffers
// (views, no copy), in place of the layer's GoMLX graph.
type native struct {
	mode  string // DecoderAuto or DecoderNative
	cfg   decoder.Config
	dec   *decoder.Decoder
	bind  *decoder.Binding
	index map[string]int // a weight's name -> its index in Generator.vars
	// held are the releases of the views of the layer being run.
	held []func()
	// copied counts the weights read into their swap-in slot because
	// zinf holds no single buffer of them to view (a tensor moved in
	// pieces, see Options.PieceBytes), or holds them in a dtype the
	// decoder does not read.
	copied map[string]bool
	said   map[string]bool // the fallbacks logged
	// table is the token embedding when it is read by rows
	// (Generator.rowsOf): Vocab rows of which only the pass's tokens'
	// are written, in pages that take memory once written; toks are the
	// pass's tokens.
	table, rowBuf []byte
	freeTable     func() error
	toks          [][]int32
	// kvc is the generation's KV cache when it is on NVMe (a layer's
	// entry bound around the layer), nil when it is one buffer.
	kvc    *zinf.KVCache
	lw     decoder.LayerWeights
	mw     decoder.ModelWeights
	logits []float32
}

// pickDecoder decides, once the Generator is built, whether its
// generations run on the native decoder (Options.Decoder), and says so in
// one log line.
func (g *Generator) pickDecoder(o Options) error {
	mode, err := ParseDecoder(o.Decoder)
	if err != nil {
		return err
	}
	log := o.Logger
	if log == nil {
		log = slog.Default()
	}
	g.decoderLog = log
	if mode == DecoderGoMLX {
		g.decoderLine = "gomlx (Options.Decoder gomlx)"
		log.Info("zinf generate: decoder gomlx (Options.Decoder)")
		return nil
	}
	n, why := g.newNative(mode)
	if n == nil {
		if mode == DecoderNative {
			return fmt.Errorf("zinf generate: decoder native: %s", why)
		}
		g.decoderLine = "gomlx: the native decoder does not cover this model: " + why
		log.Info("zinf generate: decoder gomlx, the native decoder does not cover this model", "why", why)
		return nil
	}
	n.mode = mode
	g.native = n
	kvh := n.cfg.KVHeads
	if kvh == 0 {
		kvh = n.cfg.Heads
	}
	g.decoderLine = fmt.Sprintf("native (%d layers, %d heads, %d kv-heads; weights read where zinf swapped them in; the KV cache in memory, pinned or on nvme; sampling under auto runs on GoMLX)", n.cfg.Layers, n.cfg.Heads, kvh)
	log.Info("zinf generate: decoder native")
	return nil
}

// newNative maps the model to the native decoder, or says why it cannot.
func (g *Generator) newNative(mode string) (*native, string) {
	if g.rt == nil {
		return nil, "the weights are a mapped file, not in zinf's pinned buffers"
	}
	cfg, err := nativecheck.ZooConfig(g.m)
	if err != nil {
		return nil, err.Error()
	}
	if cfg.TiedHead {
		return nil, "a tied head (the embedding is not swapped in with the head)"
	}
	if g.m.DType != dtypes.Float32 && mode != DecoderNative {
		// The decoder computes in float32 whatever the weights' dtype:
		// its tokens would not be those of GoMLX computing in the
		// model's dtype (--compute-dtype fp32 runs a bf16 model in
		// float32, covered).
		return nil, fmt.Sprintf("the model computes in %s (the native decoder computes in float32: --compute-dtype fp32, or Options.Decoder native to run it so anyway)", g.m.DType)
	}
	for _, v := range g.vars {
		if v.Shape.DType != dtypes.Float32 && v.Shape.DType != dtypes.BFloat16 {
			return nil, fmt.Sprintf("weight %q has dtype %s (covered: float32, bfloat16)", v.Name, v.Shape.DType)
		}
	}
	scope := strings.TrimSuffix(g.m.Scope.Scope(), "/")
	bind, err := cfg.Binding(decoder.ZooNames, scope)
	if err != nil {
		return nil, err.Error()
	}
	names, err := cfg.Names(decoder.ZooNames, scope)
	if err != nil {
		return nil, err.Error()
	}
	n := &native{cfg: cfg, bind: bind, index: map[string]int{}, copied: map[string]bool{}, said: map[string]bool{}}
	for i, v := range g.vars {
		n.index[v.Name] = i
	}
	used := map[string]bool{}
	for _, nm := range names {
		i, ok := n.index[nm.Name]
		if !ok {
			return nil, fmt.Sprintf("the model has no weight %q the decoder reads", nm.Name)
		}
		want := g.vars[i].Layer
		if nm.Layer >= 0 {
			want = nm.Layer + 1
		}
		if g.vars[i].Layer != want {
			return nil, fmt.Sprintf("weight %q is in zinf layer %d (the decoder reads it in layer %d)", nm.Name, g.vars[i].Layer, want)
		}
		used[nm.Name] = true
	}
	for _, v := range g.vars {
		if !used[v.Name] {
			return nil, fmt.Sprintf("the model's weight %q is none the decoder reads", v.Name)
		}
	}
	if n.dec, err = decoder.New(cfg, nil); err != nil {
		return nil, err.Error()
	}
	return n, ""
}

// Decoder says which path generations run on and, for the GoMLX path,
// why: "native (...)" or "gomlx: ...". A generation the native decoder
// does not cover runs on the GoMLX path anyway (Result.Decoder).
func (g *Generator) Decoder() string {
	if g.decoderLine == "" {
		return "gomlx: the weights are a mapped file, not in zinf's pinned buffers"
	}
	return g.decoderLine
}

// nativeCovers says whether a generation of batch sequences reaching total
// positions with sampling s runs on the native decoder, and why not.
func (g *Generator) nativeCovers(s Sampling, batch, total int) (kv plan.KVCache, why string) {
	if s.Strategy != sample.StrategyGreedy && g.native.mode != DecoderNative {
		// Auto keeps what the GoMLX path promises: a seed's draws equal
		// GoMLX's in-memory generator's.
		return kv, fmt.Sprintf("sampling %s under auto runs on GoMLX, whose draws from the seed are the in-memory generator's (Options.Decoder native samples on the native decoder: the same distribution, other draws)", s.Strategy)
	}
	c := &g.native.cfg
	kvh := c.KVHeads
	if kvh == 0 {
		kvh = c.Heads
	}
	per := int64(2) * int64(batch) * int64(total) * int64(kvh) * int64(c.HeadDim) * 4
	p, err := plan.ForKVCache(g.rt.Config, c.Layers, per)
	if err != nil {
		return kv, "the KV cache: " + err.Error()
	}
	return p, ""
}

// generateNative is Generate on the native decoder: the same passes (a
// prefill of the shortest prompt's length, then a decoding step per
// position), each streaming the layers through zinf as the GoMLX path
// does, with each layer computed by the decoder on views of the pinned
// buffers zinf swapped its weights into. The KV cache is float32 keys
// and values of the decoder's layout, one buffer for all the layers, on
// the tier zinf.kv_cache plans (memory, or pinned with cpu); the token
// is drawn from the decoder's logits in Go by the strategy (greedy, or
// nativeSampler's masks and draw).
func (g *Generator) generateNative(ctx context.Context, prompts [][]int32, s Sampling, minLen, total int, kvPlan plan.KVCache, onStep func(StepInfo)) (_ *Result, err error) {
	n := g.native
	c := &n.cfg
	B := len(prompts)
	kvh := c.KVHeads
	if kvh == 0 {
		kvh = c.Heads
	}
	values := int64(c.Layers) * int64(B) * int64(total) * int64(kvh) * int64(c.HeadDim)
	var cache *decoder.KVCache
	if kvPlan.Device == config.KVCacheNVMe {
		// One entry a layer (keys, then values), read back and written
		// behind by zinf's KV cache around each layer.
		if cache, err = decoder.NewLayerKVCache(*c, B, total); err != nil {
			return nil, fmt.Errorf("zinf generate: %w", err)
		}
		zc, err := g.rt.OpenKVCache(c.Layers, 2*4*int64(cache.LayerValues()))
		if err != nil {
			return nil, err
		}
		defer func() { err = errors.Join(err, zc.Close()) }()
		n.kvc = zc
		defer func() { n.kvc = nil }()
	} else {
		zc, err := g.rt.OpenKVCache(1, 2*4*values)
		if err != nil {
			return nil, err
		}
		defer func() { err = errors.Join(err, zc.Close()) }()
		buf, err := zc.Begin(ctx, 0)
		if err != nil {
			return nil, err
		}
		defer func() { err = errors.Join(err, zc.End(0, len(buf))) }()
		if int64(len(buf)) < 2*4*values || uintptr(unsafe.Pointer(unsafe.SliceData(buf)))%4 != 0 {
			return nil, fmt.Errorf("zinf generate: the native KV cache's buffer has %d bytes, want %d aligned to 4", len(buf), 2*4*values)
		}
		f := unsafe.Slice((*float32)(unsafe.Pointer(unsafe.SliceData(buf))), 2*values)
		if cache, err = decoder.NewKVCache(*c, B, total, f[:values:values], f[values:]); err != nil {
			return nil, fmt.Errorf("zinf generate: %w", err)
		}
	}
	res := &Result{Tokens: make([][]int32, B), KVCache: kvPlan, Decoder: DecoderNative}
	done := make([]bool, B)
	r0, w00 := g.src.bytesRead(), g.src.ioWait()
	defer g.src.endPasses()
	in := make([][]int32, B)
	for i, p := range prompts {
		in[i] = p[:minLen]
	}
	positions := make([]int, B)
	n.logits = grow32(n.logits, B*c.Vocab)
	pick := newNativeSampler(s)
	for pos := 0; pos < total-1; {
		t0, w0, rd0 := time.Now(), g.src.ioWait(), g.src.bytesRead()
		last := pos+len(in[0]) >= total-1
		if !last {
			last = true
			for i, p := range prompts {
				if pos+len(in[0]) < len(p) || !done[i] && len(res.Tokens[i])+1 < s.MaxNewTokens {
					last = false
					break
				}
			}
		}
		for i := range positions {
			positions[i] = pos
		}
		if err := g.nativePass(ctx, cache, in, positions, !last); err != nil {
			return nil, fmt.Errorf("zinf generate: step %d (position %d): %w", res.Steps, pos, err)
		}
		next := pick.next(n.logits, B, c.Vocab)
		d, wait := time.Since(t0), g.src.ioWait()-w0
		if res.Steps == 0 {
			res.Prefill, res.PrefillChunks = d, 1
		} else {
			res.Decode += d
			res.DecodeCompute += d - wait
		}
		res.Steps++
		pos += len(in[0])
		report, allDone := advance(prompts, pos, next, s, res, done, in)
		if onStep != nil {
			onStep(StepInfo{Step: res.Steps - 1, Position: pos - 1, Time: d, IOWait: wait, BytesRead: g.src.bytesRead() - rd0, Tokens: report})
		}
		if allDone {
			break
		}
	}
	res.BytesRead = g.src.bytesRead() - r0
	res.IOWait = g.src.ioWait() - w00
	return res, nil
}

// nativePass is one forward pass on the decoder: zinf swaps each layer in
// (with its prefetch of the next ones, and the kept set as always), the
// decoder reads the layer's weights where they lie, and the views are
// released before the layer is handed back. The logits land in n.logits.
func (g *Generator) nativePass(ctx context.Context, cache *decoder.KVCache, toks [][]int32, pos []int, repeat bool) error {
	n := g.native
	L := n.cfg.Layers
	g.src.forward(repeat)
	for l := 0; l < L+2; l++ {
		if err := g.src.beginLayer(ctx, l); err != nil {
			return err
		}
		var err error
		view := func(name string) (decoder.Tensor, error) { return g.nativeView(ctx, l, name) }
		switch {
		case l == 0:
			n.toks = toks
			if err = n.bind.Model(view, &n.mw); err == nil {
				err = n.dec.Begin(cache, toks, pos, &n.mw)
			}
		case l <= L:
			if err = n.bind.Layer(l-1, view, &n.lw); err == nil {
				err = n.layer(ctx, cache, l-1)
			}
		default:
			if err = n.bind.Model(view, &n.mw); err == nil {
				err = n.dec.Logits(&n.mw, n.logits)
			}
		}
		n.release()
		g.src.endLayer(l)
		if err != nil {
			return fmt.Errorf("layer %d: %w", l, err)
		}
	}
	return nil
}

// layer runs decoder layer l on n.lw; with the KV cache on NVMe (n.kvc)
// it binds the layer's entry, which zinf's KV cache reads back (ahead, as
// the GoMLX path's), around the layer and hands it back to be written
// behind.
func (n *native) layer(ctx context.Context, cache *decoder.KVCache, l int) error {
	if n.kvc == nil {
		return n.dec.Layer(l, &n.lw)
	}
	per := cache.LayerValues()
	buf, err := n.kvc.Begin(ctx, l)
	if err != nil {
		return err
	}
	if len(buf) < 2*4*per || uintptr(unsafe.Pointer(unsafe.SliceData(buf)))%4 != 0 {
		_ = n.kvc.End(l, 0)
		return fmt.Errorf("the KV cache's entry of layer %d has %d bytes, want %d aligned to 4", l, len(buf), 2*4*per)
	}
	f := unsafe.Slice((*float32)(unsafe.Pointer(unsafe.SliceData(buf))), 2*per)
	if err := cache.BindLayer(l, f[:per:per], f[per:]); err != nil {
		_ = n.kvc.End(l, 0)
		return err
	}
	err = n.dec.Layer(l, &n.lw)
	_ = cache.BindLayer(l, nil, nil)
	if err != nil {
		_ = n.kvc.End(l, 0)
		return err
	}
	return n.kvc.End(l, 2*4*per)
}

// nativeView is the decoder's view of weight name in zinf layer l: the
// bytes of its pinned buffer, held until the layer ends; a weight of
// another zinf layer is left empty (Binding.Model asks for the embedding
// and the head alike). A weight zinf holds no single buffer of is read
// into its swap-in slot, as the GoMLX path reads every weight.
func (g *Generator) nativeView(ctx context.Context, l int, name string) (decoder.Tensor, error) {
	n := g.native
	i, ok := n.index[name]
	if !ok {
		return decoder.Tensor{}, errors.New("not a weight of the model")
	}
	v := g.vars[i]
	if v.Layer != l {
		return decoder.Tensor{}, nil
	}
	if g.rowsOf != nil && name == g.rowsOf.Name {
		return g.nativeRows(ctx)
	}
	data, dt, rel, ok, err := g.rd.View(ctx, name)
	if err != nil {
		return decoder.Tensor{}, err
	}
	if ok {
		if kt, covered := kernelType(dt); covered {
			n.held = append(n.held, rel)
			return decoder.Tensor{Type: kt, Data: data}, nil
		}
		rel()
	}
	s := g.slots[v.rel]
	dst := s.bytes
	if err := g.src.readParam(ctx, v, s.dtype, dst); err != nil {
		return decoder.Tensor{}, err
	}
	n.copied[name] = true
	kt, _ := kernelType(s.dtype)
	return decoder.Tensor{Type: kt, Data: dst}, nil
}

// nativeRows is the token embedding with the rows of the pass's tokens
// read (as the GoMLX path reads them: only those from NVMe), written into
// a table of Vocab rows whose other rows are never read.
func (g *Generator) nativeRows(ctx context.Context) (decoder.Tensor, error) {
	n, v := g.native, *g.rowsOf
	zd, _ := zdtype(v.Shape.DType)
	rb := v.Shape.Dimensions[1] * zd.Size()
	if n.table == nil {
		t, free, err := sparseTable(v.Shape.Dimensions[0] * rb)
		if err != nil {
			return decoder.Tensor{}, fmt.Errorf("a table for the embedding's rows: %w", err)
		}
		n.table, n.freeTable = t, free
	}
	var rows []int
	for _, t := range n.toks {
		for _, id := range t {
			rows = append(rows, int(id))
		}
	}
	if cap(n.rowBuf) < len(rows)*rb {
		n.rowBuf = make([]byte, len(rows)*rb)
	}
	buf := n.rowBuf[:len(rows)*rb]
	if err := g.src.readRows(ctx, v, rows, zd, buf); err != nil {
		return decoder.Tensor{}, err
	}
	for i, r := range rows {
		copy(n.table[r*rb:(r+1)*rb], buf[i*rb:(i+1)*rb])
	}
	kt, _ := kernelType(zd)
	return decoder.Tensor{Type: kt, Data: n.table}, nil
}

// closeNative frees the native decoder's embedding table.
func (g *Generator) closeNative() error {
	if g.native == nil || g.native.freeTable == nil {
		return nil
	}
	err := g.native.freeTable()
	g.native.table, g.native.freeTable = nil, nil
	return err
}

func kernelType(dt tensor.DType) (kernels.DType, bool) {
	switch dt {
	case tensor.Float32:
		return kernels.F32, true
	case tensor.BFloat16:
		return kernels.BF16, true
	}
	return 0, false
}

// release hands back the views of the layer that ran.
func (n *native) release() {
	for _, r := range n.held {
		r()
	}
	n.held = n.held[:0]
}

// CopiedWeights is the weights the native decoder read through a copy
// into a swap-in buffer rather than where zinf holds them (tensors moved in
// pieces, Options.PieceBytes; a stored dtype the decoder does not read).
func (g *Generator) CopiedWeights() int {
	if g.native == nil {
		return 0
	}
	return len(g.native.copied)
}

// greedy is each sequence's token of the largest logit (the first of
// equal ones, as GoMLX's ArgMax picks; NaNs are never picked unless all
// are).
func greedy(logits []float32, batch, vocab int) []int32 {
	out := make([]int32, batch)
	for b := range batch {
		row := logits[b*vocab : (b+1)*vocab]
		best, bv := 0, float32(math.Inf(-1))
		for i, x := range row {
			if x > bv {
				best, bv = i, x
			}
		}
		out[b] = int32(best)
	}
	return out
}

func grow32(s []float32, n int) []float32 {
	if cap(s) < n {
		return make([]float32, n)
	}
	return s[:n]
}

// tryNative runs Generate's generation on the native decoder when the
// Generator has one and it covers the generation (handled true); under
// DecoderAuto a generation it does not cover runs on the GoMLX path, said
// in a log line, and under DecoderNative it is an error.
func (g *Generator) tryNative(ctx context.Context, prompts [][]int32, s Sampling, minLen, total int, onStep func(StepInfo)) (res *Result, handled bool, err error) {
	if g.native == nil {
		return nil, false, nil
	}
	kvp, why := g.nativeCovers(s, len(prompts), total)
	if why == "" {
		res, err = g.generateNative(ctx, prompts, s, minLen, total, kvp, onStep)
		return res, true, err
	}
	if g.native.mode == DecoderNative {
		return nil, true, fmt.Errorf("zinf generate: decoder native (Options.Decoder): %s", why)
	}
	if g.decoderLog != nil && !g.native.said[why] {
		// Once per reason: a warning, since a caller who left the choice
		// to auto may expect the native decoder's speed.
		g.native.said[why] = true
		g.decoderLog.Warn("zinf generate: the native decoder does not cover this generation: it runs on the GoMLX path", "why", why)
	}
	return nil, false, nil
}

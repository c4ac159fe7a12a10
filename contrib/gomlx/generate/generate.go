// Package generate generates tokens from GoMLX's zoo transformer
// (github.com/gomlx/gomlx/ml/zoo/transformer) with its weights in zinf: on
// NVMe, streamed layer by layer through the pinned pool with prefetch, for
// a batch of prompts. Each step (the prefill of the prompts, then one
// decoding step per token) is one forward pass of the zinf runtime: the
// token embedding, each transformer layer (zoo ForwardLayer, with a KV
// cache of GoMLX's kvcache semantics) and the head (final normalization,
// LogitsFromEmbeddings and one of GoMLX's sampling strategies: greedy,
// temperature, top-k, top-p), each a compiled GoMLX graph fed from one set
// of swap-in buffers reused from layer to layer.
//
// The numbers are GoMLX's own: greedy generation equals GoMLX's
// generate.Generator over the same model and weights in memory token for
// token (InMemory runs that reference), and so does sampling from the same
// seed.
package generate

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime"
	"runtime/metrics"
	"slices"
	"strings"
	"time"

	"github.com/gomlx/compute"
	"github.com/gomlx/compute/shapes"
	"github.com/gomlx/gomlx/core/graph"
	"github.com/gomlx/gomlx/core/tensors"
	"github.com/gomlx/gomlx/ml/layers"
	"github.com/gomlx/gomlx/ml/layers/attention/kvcache"
	"github.com/gomlx/gomlx/ml/model"
	"github.com/gomlx/gomlx/ml/zoo/transformer"
	"github.com/gomlx/gomlx/ml/zoo/transformer/generate/sample"

	"github.com/zinfio/zinf"
	"github.com/zinfio/zinf/config"
	"github.com/zinfio/zinf/contrib/gomlx/internal/backendinfo"
	"github.com/zinfio/zinf/contrib/gomlx/internal/layerexec"
	"github.com/zinfio/zinf/plan"
	"github.com/zinfio/zinf/swapper"
	"github.com/zinfio/zinf/tensor"
	"github.com/zinfio/zinf/trace"
)

// Weights gives a model's initial values one tensor at a time (the full
// tensor, widened to fp32), so the model is never whole in memory.
type Weights interface {
	Read(ctx context.Context, v Var, dst []float32) error
}

// InPlaceWeights are Weights whose tensors lie in files as the runtime
// stores them: Locate says where (the file, the offset of the tensor's
// first byte, its dtype), and Open reads them there
// (zinf.Runtime.InitInPlace) when the layout allows, with no copy in the
// swap files; the others are read and copied.
type InPlaceWeights interface {
	Weights
	Locate(v Var) (path string, off int64, dtype tensor.DType, ok bool)
}

// Options adjust Open.
type Options struct {
	// Logger for zinf's warnings. Default: slog.Default().
	Logger *slog.Logger
	// PrefetchDepth, when > 0, is the layers swapped in ahead of use
	// (zinf.Options.PrefetchDepth); default: the plan's.
	PrefetchDepth int
	// Trace receives the runtime's timeline (zinf.Options.Trace).
	Trace trace.Sink
	// NoBandwidthProbe: see zinf.Options.
	NoBandwidthProbe bool
	// PieceBytes: see zinf.Options (tensors larger move in pieces, and the
	// token embedding's rows are read alone).
	PieceBytes int64
	// InPlaceOnly makes Open fail, naming the tensor, where InPlaceWeights
	// cannot give a tensor in place, rather than copy it into the swap
	// files (a model too large for a second copy on the disk).
	InPlaceOnly bool
	// PrefillBytes bounds the memory a prefill takes beyond the pinned
	// pool and the KV cache (Generator.PrefillBytes: its activations and
	// one chunk's working set); Generate and PlanBatch refuse prompts that
	// need more. Default: DefaultPrefillBytes.
	PrefillBytes int64
	// Decoder picks the path generations run on: DecoderAuto ("" too:
	// the native decoder where it covers the model and the generation,
	// GoMLX's graphs otherwise), DecoderNative or DecoderGoMLX (see
	// native.go).
	Decoder string
}

// DefaultPrefillBytes is Options.PrefillBytes' default: a prompt of a few
// thousand tokens on a model of a few thousand dimensions (zinf-generate
// --prefill-bytes sets it; its memory bound counts the prefill's figure).
const DefaultPrefillBytes = 256 << 20

// Sampling says how the next token is chosen and when generation stops.
type Sampling struct {
	// Strategy: sample.StrategyGreedy (the default), StrategyTemperature,
	// StrategyTopK or StrategyTopP (beam search is not supported).
	Strategy    sample.Strategy
	Temperature float64 // default 1
	TopK        int     // default 50
	TopP        float64 // default 0.9
	// Seed seeds the sampling's random numbers (the Store's RNG, as
	// GoMLX's generator draws them).
	Seed int64
	// MaxNewTokens is the tokens generated per prompt (required, > 0).
	MaxNewTokens int
	// EOS and Stop are token ids that end a sequence (the token is kept
	// as its last); generation ends when every sequence has ended.
	EOS, Stop []int
}

func (s *Sampling) check(vocab int) error {
	var errs []error
	switch s.Strategy {
	case sample.StrategyGreedy, sample.StrategyTemperature, sample.StrategyTopK, sample.StrategyTopP:
	default:
		errs = append(errs, fmt.Errorf("zinf generate: sampling strategy %s (allowed: greedy, temperature, top_k, top_p)", s.Strategy))
	}
	if s.Temperature == 0 {
		s.Temperature = 1
	}
	if s.TopK == 0 {
		s.TopK = 50
	}
	if s.TopP == 0 {
		s.TopP = 0.9
	}
	if s.Temperature < 0 {
		errs = append(errs, fmt.Errorf("zinf generate: temperature %g (allowed: > 0)", s.Temperature))
	}
	if s.TopK < 0 || s.TopK > vocab {
		errs = append(errs, fmt.Errorf("zinf generate: top-k %d (allowed: 1..%d, the vocabulary)", s.TopK, vocab))
	}
	if s.TopP < 0 || s.TopP > 1 {
		errs = append(errs, fmt.Errorf("zinf generate: top-p %g (allowed: 0 < p <= 1)", s.TopP))
	}
	if s.MaxNewTokens <= 0 {
		errs = append(errs, fmt.Errorf("zinf generate: max new tokens %d (allowed: > 0)", s.MaxNewTokens))
	}
	for _, t := range append(slices.Clone(s.EOS), s.Stop...) {
		if t < 0 || t >= vocab {
			errs = append(errs, fmt.Errorf("zinf generate: EOS/stop token %d (allowed: 0..%d)", t, vocab-1))
		}
	}
	return errors.Join(errs...)
}

func (s *Sampling) ends(tok int32) bool {
	return slices.Contains(s.EOS, int(tok)) || slices.Contains(s.Stop, int(tok))
}

// Generator generates from one model whose weights zinf holds. It is for
// one goroutine.
type Generator struct {
	rt      *zinf.Runtime // nil for a mapped model (OpenMapped)
	rd      *zinf.Reader  // rt's read path, nil with rt
	src     source        // where each layer's weights come from
	backend compute.Backend
	store   *model.Store
	m       *transformer.Model
	vars    []Var
	byLayer [][]int // indexes into vars per zinf layer
	slots   map[string]*slot
	embedEx *boundedExec
	layerEx []*boundedExec
	headEx  map[sampleKey]*boundedExec
	// prefillBytes is Options.PrefillBytes; chunks is the graph calls
	// the last transformer layer run made (Result.PrefillChunks).
	prefillBytes int64
	chunks       int
	kvHeads      int
	// rowsOf, when set, is the token embedding read by rows: the model's
	// input is exactly the rows of its tokens (no scaling, token types or
	// normalization), so only those rows are read from NVMe.
	rowsOf *Var
	// inPlace counts the weights read where they lie, and their bytes.
	inPlace      int
	inPlaceBytes int64
	closed       bool
	// native is the native decoder, when it covers the model
	// (Options.Decoder); decoderLine says which path, decoderLog where
	// a generation's fallback is said.
	native      *native
	decoderLine string
	decoderLog  *slog.Logger
}

type sampleKey struct {
	strategy    sample.Strategy
	temperature float64
	topK        int
	topP        float64
}

// slot is a swap-in buffer (layerexec.NewBuffer, as the trainer's): a
// GoMLX tensor over a backend shared buffer, the value of every variable
// of its relative path (one per transformer layer), so zinf's bytes land
// where the executor reads them.
type slot struct {
	t     *tensors.Tensor
	bytes []byte
	// dtype is the slot's element type in zinf's words: what zinf's
	// bytes are converted to as they land (the stored dtype may differ).
	dtype tensor.DType
}

// Open builds the model with fn, registers its weights in a zinf runtime
// opened for inference on cfg (offload_param says where they live: nvme
// streams them from the swap files) and stores the values w gives, one
// tensor at a time.
func Open(ctx context.Context, backend compute.Backend, cfg *config.Config, fn ModelFn, w Weights, o Options) (g *Generator, err error) {
	if backend == nil || cfg == nil || fn == nil || w == nil {
		return nil, errors.New("zinf generate: Open needs a backend, a config, a ModelFn and Weights")
	}
	backend = WithKVCacheOps(backend)
	store, m, vars, err := build(backend, fn)
	if err != nil {
		return nil, err
	}
	if c, ok := w.(ModelChecker); ok {
		// Before the runtime makes anything: weights of another model
		// (a shape, a tensor too many or too few) are refused whole.
		if err := c.CheckModel(vars); err != nil {
			store.Finalize()
			return nil, err
		}
	}
	descs := make([]tensor.Desc, len(vars))
	for i, v := range vars {
		descs[i] = v.Desc()
	}
	backendinfo.WarnPortable(o.Logger, backend)
	rt, err := zinf.Open(cfg, zinf.Model{Tensors: descs, Layers: m.NumLayers + 2}, zinf.Options{Logger: o.Logger, Inference: true,
		PrefetchDepth: o.PrefetchDepth, Trace: o.Trace, NoBandwidthProbe: o.NoBandwidthProbe, PieceBytes: o.PieceBytes})
	if err != nil {
		return nil, err
	}
	rd, err := rt.Reader()
	if err != nil {
		rt.Close()
		return nil, err
	}
	g = newGenerator(rtSource{rt, rd}, backend, store, m, vars)
	g.rt, g.rd = rt, rd
	if o.PrefillBytes > 0 {
		g.prefillBytes = o.PrefillBytes
	}
	gen := g // a failed return sets g to nil before the deferred Close
	defer func() {
		if err != nil {
			gen.Close()
		}
	}()
	var buf []float32
	lw, _ := w.(InPlaceWeights)
	for i, v := range vars {
		g.byLayer[v.Layer] = append(g.byLayer[v.Layer], i)
		if err := g.bind(v); err != nil {
			return nil, err
		}
		if lw != nil {
			if path, off, dt, ok := lw.Locate(v); ok {
				err := rt.InitInPlace(ctx, v.Name, path, off, dt)
				if err == nil {
					g.inPlace++
					g.inPlaceBytes += int64(v.Numel() * dt.Size())
					continue
				}
				if !errors.Is(err, swapper.ErrNotInPlace) || o.InPlaceOnly {
					return nil, err
				}
			} else if o.InPlaceOnly {
				return nil, fmt.Errorf("zinf generate: %q is not in the weights' files as the runtime stores it (Options.InPlaceOnly)", v.Name)
			}
		} else if o.InPlaceOnly {
			return nil, errors.New("zinf generate: Options.InPlaceOnly needs InPlaceWeights (a checkpoint or safetensors files)")
		}
		n := v.Numel()
		if cap(buf) < n {
			buf = make([]float32, n)
		}
		if err := w.Read(ctx, v, buf[:n]); err != nil {
			return nil, fmt.Errorf("zinf generate: weights of %q: %w", v.Name, err)
		}
		if err := rt.Init(ctx, v.Name, buf[:n]); err != nil {
			return nil, err
		}
	}
	if err := g.finish(); err != nil {
		return nil, err
	}
	if err := g.pickDecoder(o); err != nil {
		return nil, err
	}
	return g, nil
}

// build builds the model with fn on a new Store, checks it and discovers
// its variables (no values are made).
func build(backend compute.Backend, fn ModelFn) (*model.Store, *transformer.Model, []Var, error) {
	store := model.NewStore()
	var m *transformer.Model
	if err := catch(func() error { m = fn(store.RootScope()); return nil }); err != nil {
		return nil, nil, nil, fmt.Errorf("zinf generate: ModelFn: %w", err)
	}
	if err := checkModel(m); err != nil {
		return nil, nil, nil, err
	}
	vars, err := discover(backend, store, m)
	if err != nil {
		return nil, nil, nil, err
	}
	return store, m, vars, nil
}

func newGenerator(src source, backend compute.Backend, store *model.Store, m *transformer.Model, vars []Var) *Generator {
	g := &Generator{src: src, backend: backend, store: store, m: m, vars: vars, slots: map[string]*slot{}, headEx: map[sampleKey]*boundedExec{},
		byLayer: make([][]int, m.NumLayers+2), kvHeads: m.NumKVHeads, prefillBytes: DefaultPrefillBytes}
	if g.kvHeads == 0 {
		g.kvHeads = m.NumHeads
	}
	return g
}

// finish reads a plain token embedding by rows and creates the executors,
// once every variable is bound.
func (g *Generator) finish() error {
	m := g.m
	if l0 := g.byLayer[0]; len(l0) == 1 && !m.ScaleTokenEmbeddings && m.TokenTypeEmbedSize == 0 &&
		(m.EmbedNormalization == "" || m.EmbedNormalization == layers.NormalizationNone) && strings.HasSuffix(g.vars[l0[0]].Name, "/token_embed/embeddings") {
		g.rowsOf = &g.vars[l0[0]]
	}
	m.PopulateKVCacheConfigs()
	return g.compile()
}

// ModelVars lists the weights of the model fn builds, in zinf order (the
// token embedding, each transformer layer, the head), without making any
// of their values.
func ModelVars(backend compute.Backend, fn ModelFn) ([]Var, error) {
	if backend == nil || fn == nil {
		return nil, errors.New("zinf generate: ModelVars needs a backend and a ModelFn")
	}
	store, _, vars, err := build(WithKVCacheOps(backend), fn)
	if store != nil {
		store.Finalize()
	}
	return vars, err
}

// bind gives the Store's variable v the slot of its relative path.
func (g *Generator) bind(v Var) error {
	s := g.slots[v.rel]
	if s == nil {
		zd, err := zdtype(v.Shape.DType)
		if err != nil {
			return err
		}
		b, err := layerexec.NewBuffer(g.backend, v.Shape)
		if err != nil {
			return fmt.Errorf("zinf generate: a swap-in buffer for %q (%s): %w", v.Name, v.Shape, err)
		}
		s = &slot{t: b.T, bytes: b.Bytes, dtype: zd}
		g.slots[v.rel] = s
	} else if !s.t.Shape().Equal(v.Shape) {
		return fmt.Errorf("zinf generate: %q has shape %s, %s of another layer", v.Name, v.Shape, s.t.Shape())
	}
	sv := g.store.GetVariable(v.Name)
	if sv == nil {
		return fmt.Errorf("zinf generate: variable %q vanished from the Store", v.Name)
	}
	return sv.SetValue(s.t)
}

// compile creates the executors (graphs compile on first use per shape).
func (g *Generator) compile() error {
	m := g.m
	g.embedEx = &boundedExec{make: func() (*model.Exec, error) {
		e, err := model.NewExec(g.backend, g.store, func(scope *model.Scope, tokens *graph.Node) *graph.Node {
			m.Scope = m.Scope.ResetVisited()
			return embed(m, tokens)
		})
		if err == nil {
			e.WithName("zinf.generate.embed")
		}
		return e, err
	}}
	for l := range m.NumLayers {
		g.layerEx = append(g.layerEx, &boundedExec{make: func() (*model.Exec, error) {
			e, err := model.NewExec(g.backend, g.store, func(scope *model.Scope, in []*graph.Node) []*graph.Node {
				m.Scope = m.Scope.ResetVisited()
				path := m.KVCache.OrderedScopes[l]
				cache := kvcache.KVCacheNodes{path + kvcache.KeySuffix: in[2], path + kvcache.ValueSuffix: in[3]}
				x := m.ForwardLayer(m.Scope.In("layer_%d", l), l, in[0], in[1], cache, nil, nil, transformer.CallOptions{})
				return []*graph.Node{x, cache[path+kvcache.KeySuffix], cache[path+kvcache.ValueSuffix]}
			})
			if err == nil {
				e.WithName(fmt.Sprintf("zinf.generate.layer%d", l))
			}
			return e, err
		}})
	}
	return nil
}

// maxGraphs is the graphs a boundedExec keeps, under GoMLX's default
// cache size (graph.DefaultExecMaxCacheSize), past which an Exec refuses
// every new input shape.
const maxGraphs = 24

// boundedExec is an executor whose compiled graphs (one per input shape:
// the batch, the positions of a pass or a prefill's chunk, the KV cache's
// bucketed length) stay bounded over a Generator's life: when maxGraphs
// shapes are compiled, the next new one makes the Exec anew, freeing its
// graphs, rather than fail.
type boundedExec struct {
	make   func() (*model.Exec, error)
	e      *model.Exec
	shapes map[string]bool
}

// call runs the executor on args, whose input shapes key names, turning a
// panic into an error.
func (b *boundedExec) call(k string, args ...any) ([]*tensors.Tensor, error) {
	if b.e != nil && !b.shapes[k] && len(b.shapes) >= maxGraphs {
		b.finalize()
	}
	if b.e == nil {
		e, err := b.make()
		if err != nil {
			return nil, err
		}
		b.e, b.shapes = e, map[string]bool{}
	}
	b.shapes[k] = true
	return call(b.e, args...)
}

// shapeKey names a graph's input shapes.
func shapeKey(ss ...shapes.Shape) string {
	var b strings.Builder
	for _, s := range ss {
		b.WriteString(s.String())
		b.WriteByte(';')
	}
	return b.String()
}

func (b *boundedExec) finalize() {
	if b != nil && b.e != nil {
		b.e.Finalize()
		b.e = nil
	}
}

// headExec is the head's executor for a sampling configuration.
func (g *Generator) headExec(s Sampling) *boundedExec {
	k := sampleKey{s.Strategy, s.Temperature, s.TopK, s.TopP}
	if s.Strategy == sample.StrategyGreedy {
		k = sampleKey{}
	}
	if e := g.headEx[k]; e != nil {
		return e
	}
	m := g.m
	e := &boundedExec{make: func() (*model.Exec, error) {
		e, err := model.NewExec(g.backend, g.store, func(scope *model.Scope, x *graph.Node) *graph.Node {
			m.Scope = m.Scope.ResetVisited()
			return Sample(scope, head(m, x), k.strategy, k.temperature, k.topK, k.topP)
		})
		if err == nil {
			e.WithName("zinf.generate.head")
		}
		return e, err
	}}
	g.headEx[k] = e
	return e
}

// Runtime is the zinf runtime holding the weights (plan, metrics).
func (g *Generator) Runtime() *zinf.Runtime { return g.rt }

// InPlace reports the weights read where they lie (InPlaceWeights) and
// their bytes; the others were copied into the swap files.
func (g *Generator) InPlace() (tensors int, bytes int64) { return g.inPlace, g.inPlaceBytes }

// Vars lists the model's weights in zinf order.
func (g *Generator) Vars() []Var { return slices.Clone(g.vars) }

// Close frees the executors, the swap-in buffers and the runtime.
func (g *Generator) Close() error {
	if g.closed {
		return nil
	}
	g.closed = true
	g.embedEx.finalize()
	for _, e := range g.layerEx {
		e.finalize()
	}
	for _, e := range g.headEx {
		e.finalize()
	}
	for _, s := range g.slots {
		layerexec.Finalize(s.t)
	}
	return errors.Join(g.closeNative(), g.src.close())
}

// Result is a generation's tokens and what it measured.
type Result struct {
	// Tokens are the generated tokens per prompt (an EOS or stop token
	// that ended a sequence is its last).
	Tokens [][]int32
	// Steps is the forward passes run (the prefill included).
	Steps int
	// PrefillChunks is the chunks each transformer layer ran the prefill
	// in: 1, one graph of all its positions, up to 64 of them (fewer over
	// a long KV cache or for a large layer); a longer prompt runs in
	// chunks of that many, in order, each over the KV cache so far.
	PrefillChunks int
	// Prefill and Decode are the time of the first pass and of the others;
	// DecodeCompute is Decode less its waits for weights.
	Prefill, Decode, DecodeCompute time.Duration
	// IOWait is the time the passes waited for weights.
	IOWait time.Duration
	// BytesRead is what the runtime read from NVMe.
	BytesRead int64
	// KVCache is where the KV cache lived (zinf.kv_cache) and KVStats
	// its traffic with NVMe.
	KVCache plan.KVCache
	KVStats zinf.KVCacheStats
	// Decoder is the path the generation ran on: DecoderNative or
	// DecoderGoMLX.
	Decoder string
}

// Generated is the number of tokens generated over the batch.
func (r *Result) Generated() int {
	n := 0
	for _, t := range r.Tokens {
		n += len(t)
	}
	return n
}

// DecodeTokensPerSecond is the batch's tokens per second of decoding
// (one token per sequence per step after the prefill).
func (r *Result) DecodeTokensPerSecond() float64 {
	if r.Decode <= 0 || r.Steps <= 1 {
		return 0
	}
	return float64(len(r.Tokens)*(r.Steps-1)) / r.Decode.Seconds()
}

// StepInfo is reported after each pass.
type StepInfo struct {
	Step     int           // 0: the prefill
	Position int           // the position of the pass's first token
	Time     time.Duration // the pass
	IOWait   time.Duration // of it, waiting for weights
	// BytesRead is the weight bytes read from NVMe (or copied from a
	// mapping) while the pass ran: its own reads, and the prefetches of the
	// next pass's first layers that it issued.
	BytesRead int64
	Tokens    []int32 // the token sampled for each sequence (-1: none yet, or ended)
}

// Generate runs prompts (token ids, one sequence each) as one batch: a
// prefill of the shortest prompt's length, then one decoding step per
// position (a longer prompt feeds its own tokens until it is consumed),
// every step one pass over the weights zinf streams. onStep, when not nil,
// is called after each pass.
func (g *Generator) Generate(ctx context.Context, prompts [][]int32, s Sampling, onStep func(StepInfo)) (*Result, error) {
	if g.closed {
		return nil, errors.New("zinf generate: the Generator is closed")
	}
	if err := s.check(g.m.VocabSize); err != nil {
		return nil, err
	}
	if len(prompts) == 0 {
		return nil, errors.New("zinf generate: no prompts")
	}
	minLen, maxLen := len(prompts[0]), 0
	for i, p := range prompts {
		if len(p) == 0 {
			return nil, fmt.Errorf("zinf generate: prompt %d is empty", i)
		}
		for _, t := range p {
			if t < 0 || int(t) >= g.m.VocabSize {
				return nil, fmt.Errorf("zinf generate: prompt %d: token %d (allowed: 0..%d)", i, t, g.m.VocabSize-1)
			}
		}
		minLen, maxLen = min(minLen, len(p)), max(maxLen, len(p))
	}
	total := maxLen + s.MaxNewTokens
	if lim := g.m.KVCache.MaxSeqLenPerLayerType[0]; total > lim {
		return nil, fmt.Errorf("zinf generate: %d prompt tokens + %d new tokens exceed the KV cache's %d positions", maxLen, s.MaxNewTokens, lim)
	}
	B := len(prompts)
	if need := g.PrefillBytes(B, minLen); need > g.prefillBytes {
		return nil, g.prefillError(B, minLen, need)
	}
	if res, ok, err := g.tryNative(ctx, prompts, s, minLen, total, onStep); ok {
		return res, err
	}
	headEx := g.headExec(s)
	if err := g.store.SetRNGStateFromSeed(s.Seed); err != nil {
		return nil, err
	}
	kv, err := g.openKV(B, minLen, total)
	if err != nil {
		return nil, err
	}
	defer kv.free()
	res := &Result{Tokens: make([][]int32, B), KVCache: kv.c.Plan(), Decoder: DecoderGoMLX}
	done := make([]bool, B)
	r0, w00 := g.src.bytesRead(), g.src.ioWait()
	// Each pass prefetches the next one's first layers; the last pass's
	// (or a failed one's) go back when Generate returns.
	defer g.src.endPasses()
	// The first pass feeds every prompt's first minLen tokens.
	in := make([][]int32, B)
	for i, p := range prompts {
		in[i] = p[:minLen]
	}
	for pos := 0; pos < total-1; {
		t0, w0, rd0 := time.Now(), g.src.ioWait(), g.src.bytesRead()
		// A pass after which every sequence has its tokens is the last
		// (an EOS may end generation earlier): it prefetches nothing of
		// the next.
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
		next, err := g.pass(ctx, in, pos, kv, headEx, !last)
		if err != nil {
			return nil, fmt.Errorf("zinf generate: step %d (position %d): %w", res.Steps, pos, err)
		}
		d, wait := time.Since(t0), g.src.ioWait()-w0
		if res.Steps == 0 {
			res.Prefill, res.PrefillChunks = d, g.chunks
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
	res.KVStats = kv.c.Stats()
	res.BytesRead = g.src.bytesRead() - r0
	res.IOWait = g.src.ioWait() - w00
	return res, nil
}

// pass runs one forward pass over the weights: tokens [B][S] at position
// pos, returning the sampled next token of each sequence. repeat: another
// pass follows, whose first layers this one prefetches.
func (g *Generator) pass(ctx context.Context, toks [][]int32, pos int, kv *kvState, headEx *boundedExec, repeat bool) ([]int32, error) {
	rt := g.src
	L := g.m.NumLayers
	rt.forward(repeat)
	kv.grow(pos + len(toks[0]))
	var x *tensors.Tensor
	defer func() { finalize(x) }()
	for l := 0; l < L+2; l++ {
		if err := g.beginLayer(ctx, l); err != nil {
			return nil, err
		}
		var err error
		switch {
		case l == 0 && g.rowsOf != nil:
			x, err = g.embedRows(ctx, toks)
		case l == 0:
			var out []*tensors.Tensor
			t := tensors.FromValue(toks)
			out, err = g.embedEx.call(shapeKey(t.Shape()), t)
			if err == nil {
				x = out[0]
			}
		case l <= L:
			in := x
			x = nil // the layer owns it
			x, err = g.layer(ctx, l-1, in, pos, kv)
		default:
			// The head samples from the last position's logits (as GoMLX's
			// generator does): the others' are never computed.
			if x, err = lastPosition(x); err != nil {
				break
			}
			var out []*tensors.Tensor
			out, err = headEx.call(shapeKey(x.Shape()), x)
			if err == nil {
				var next []int32
				err = tensors.ConstFlatData(out[0], func(flat []int32) { next = slices.Clone(flat) })
				finalize(out[0])
				rt.endLayer(l)
				return next, err
			}
		}
		rt.endLayer(l)
		if err != nil {
			return nil, fmt.Errorf("layer %d: %w", l, err)
		}
	}
	return nil, errors.New("no head layer")
}

// layer runs transformer layer l over x [B, S, dim] (which it owns) at
// position pos, its KV cache read from and written back to kv, and returns
// its output. A pass of more positions than prefillChunk allows (a
// prefill) runs in chunks, in order, checking ctx between them: each a
// graph of bounded size whose queries attend the positions before them
// through the KV cache so far (its bucketed length, GoMLX's kvcache
// CacheSeqLen, grows from chunk to chunk), as in one pass of them all.
func (g *Generator) layer(ctx context.Context, l int, x *tensors.Tensor, pos int, kv *kvState) (_ *tensors.Tensor, err error) {
	k, v, err := kv.load(ctx, l)
	if err != nil {
		finalize(x)
		return nil, err
	}
	defer func() {
		if err != nil {
			finalize(k)
			finalize(v)
			kv.abandon(l)
		}
	}()
	xs := x.Shape()
	B, S := xs.Dimensions[0], xs.Dimensions[1]
	g.chunks = 1
	if S <= g.prefillChunk(B, k.Shape().Dimensions[2]) {
		var y *tensors.Tensor
		if y, k, v, err = g.layerCall(l, x, pos, k, v); err != nil {
			return nil, err
		}
		if err = kv.store(l, k, v); err != nil {
			k, v = nil, nil // store finalizes them
			finalize(y)
			return nil, err
		}
		return y, nil
	}
	defer finalize(x)
	row := xs.Size() / (B * S) * xs.DType.Size() // bytes of one position
	out := tensors.FromShape(xs)
	defer func() {
		if err != nil {
			finalize(out)
		}
	}()
	g.chunks = 0
	gc := newGCPacer(prefillGarbage)
	for c0 := 0; c0 < S; g.chunks++ {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		gc.step()
		// Full chunks, then the rest in chunks of powers of two: a
		// bounded set of graph shapes whatever the prompt's length.
		n := g.prefillChunk(B, g.kvLen(l, pos+min(S, c0+maxPrefillChunk)))
		for n > S-c0 {
			n /= 2
		}
		// The cache of the positions up to the chunk's end: those after
		// it are not written yet.
		if k, err = resizeSeq(k, g.kvLen(l, pos+c0+n)); err == nil {
			v, err = resizeSeq(v, g.kvLen(l, pos+c0+n))
		}
		if err != nil {
			return nil, err
		}
		xc := tensors.FromShape(shapes.Make(xs.DType, B, n, xs.Dimensions[2]))
		var inner error
		merr := xc.MutableBytes(func(dst []byte) {
			inner = x.ConstBytes(func(src []byte) {
				for b := range B {
					copy(dst[b*n*row:(b+1)*n*row], src[(b*S+c0)*row:(b*S+c0+n)*row])
				}
			})
		})
		if err = errors.Join(merr, inner); err != nil {
			finalize(xc)
			return nil, err
		}
		var y *tensors.Tensor
		if y, k, v, err = g.layerCall(l, xc, pos+c0, k, v); err != nil {
			return nil, err
		}
		cerr := y.ConstBytes(func(src []byte) {
			inner = out.MutableBytes(func(dst []byte) {
				for b := range B {
					copy(dst[(b*S+c0)*row:(b*S+c0+n)*row], src[b*n*row:(b+1)*n*row])
				}
			})
		})
		finalize(y)
		if err = errors.Join(cerr, inner); err != nil {
			return nil, err
		}
		c0 += n
	}
	if err = kv.store(l, k, v); err != nil {
		k, v = nil, nil
		return nil, err
	}
	return out, nil
}

// layerCall runs layer l's graph once: x [B, n, dim] at position pos over
// the KV cache k, v, all three donated (the graph updates the cache in
// place); it returns the layer's output and the updated cache. On an
// error the inputs are freed.
func (g *Generator) layerCall(l int, x *tensors.Tensor, pos int, k, v *tensors.Tensor) (y, k2, v2 *tensors.Tensor, err error) {
	key := shapeKey(x.Shape(), k.Shape())
	xd, xerr := graph.DonateTensorBuffer(x, g.backend, 0)
	kd, kerr := graph.DonateTensorBuffer(k, g.backend, 0)
	vd, verr := graph.DonateTensorBuffer(v, g.backend, 0)
	// A donated tensor keeps its local copy, if it had one: freed now.
	finalize(x)
	finalize(k)
	finalize(v)
	if err := errors.Join(xerr, kerr, verr); err != nil {
		return nil, nil, nil, err
	}
	out, err := g.layerEx[l].call(key, xd, tensors.FromValue(int32(pos)), kd, vd)
	if err != nil {
		return nil, nil, nil, err
	}
	return out[0], out[1], out[2], nil
}

// gcPacer bounds the garbage a prefill's chunks leave between two
// collections. Each chunk's graph allocates its intermediates anew (the
// attention scores of its positions over the cache, per head), megabytes
// that are garbage when it returns; the collector lets the heap grow by
// GOGC% of the whole live heap (the model's swap-in buffers included)
// before it runs, so a long prefill on a wide model reached twice its live
// heap: 880 MiB for a 4000-token prompt at width 2048 (744 MiB with a
// collection every 128 MiB) where the printed bound was 608 MiB. A
// collection whenever the chunks have allocated limit bytes since the last
// one keeps the peak near the live heap plus limit (PrefillBytes counts
// prefillGarbage).
type gcPacer struct {
	limit   uint64
	samples []metrics.Sample
	allocs  uint64 // at the last collection
	cycles  uint64
}

func newGCPacer(limit uint64) *gcPacer {
	p := &gcPacer{limit: limit, samples: []metrics.Sample{{Name: "/gc/heap/allocs:bytes"}, {Name: "/gc/cycles/total:gc-cycles"}}}
	p.allocs, p.cycles = p.read()
	return p
}

func (p *gcPacer) read() (allocs, cycles uint64) {
	metrics.Read(p.samples)
	if p.samples[0].Value.Kind() == metrics.KindUint64 {
		allocs = p.samples[0].Value.Uint64()
	}
	if p.samples[1].Value.Kind() == metrics.KindUint64 {
		cycles = p.samples[1].Value.Uint64()
	}
	return allocs, cycles
}

// step collects when limit bytes were allocated since the last collection
// (its own or the runtime's).
func (p *gcPacer) step() {
	allocs, cycles := p.read()
	if cycles != p.cycles {
		p.allocs, p.cycles = allocs, cycles
		return
	}
	if allocs-p.allocs >= p.limit {
		runtime.GC()
		p.allocs, p.cycles = p.read()
	}
}

// resizeSeq is the KV cache tensor t [batch, heads, length, head dim] with
// n positions: its first n (the later ones are not written yet), or all of
// them and zeros after (as kvcache.PadTensors pads). t is freed when
// another tensor is returned, or on an error.
func resizeSeq(t *tensors.Tensor, n int) (*tensors.Tensor, error) {
	ts := t.Shape()
	if ts.Rank() != 4 {
		finalize(t)
		return nil, fmt.Errorf("KV cache tensor %s (want rank 4)", ts)
	}
	S := ts.Dimensions[2]
	if S == n {
		return t, nil
	}
	defer finalize(t)
	dims := slices.Clone(ts.Dimensions)
	dims[2] = n
	r := tensors.FromShape(shapes.Make(ts.DType, dims...))
	row := ts.Dimensions[3] * ts.DType.Size()
	keep := min(S, n) * row
	var inner error
	merr := r.MutableBytes(func(dst []byte) {
		inner = t.ConstBytes(func(src []byte) {
			for i := range ts.Dimensions[0] * ts.Dimensions[1] {
				copy(dst[i*n*row:i*n*row+keep], src[i*S*row:i*S*row+keep])
			}
		})
	})
	if err := errors.Join(merr, inner); err != nil {
		finalize(r)
		return nil, err
	}
	return r, nil
}

// lastPosition is x [B, S, dim]'s last position, [B, 1, dim]; x is freed.
func lastPosition(x *tensors.Tensor) (*tensors.Tensor, error) {
	xs := x.Shape()
	B, S := xs.Dimensions[0], xs.Dimensions[1]
	if S == 1 {
		return x, nil
	}
	defer finalize(x)
	row := xs.Size() / (B * S) * xs.DType.Size()
	y := tensors.FromShape(shapes.Make(xs.DType, B, 1, xs.Dimensions[2]))
	var inner error
	merr := y.MutableBytes(func(dst []byte) {
		inner = x.ConstBytes(func(src []byte) {
			for b := range B {
				copy(dst[b*row:(b+1)*row], src[(b*S+S-1)*row:(b*S+S)*row])
			}
		})
	})
	if err := errors.Join(merr, inner); err != nil {
		finalize(y)
		return nil, err
	}
	return y, nil
}

// embedRows is the token embedding of toks [B][S]: the rows of the tokens,
// read alone (an embedding lookup is a gather: the values are the rows).
func (g *Generator) embedRows(ctx context.Context, toks [][]int32) (*tensors.Tensor, error) {
	B, S := len(toks), len(toks[0])
	rows := make([]int, 0, B*S)
	for _, t := range toks {
		for _, id := range t {
			rows = append(rows, int(id))
		}
	}
	v := g.rowsOf
	zd, _ := zdtype(v.Shape.DType)
	x := tensors.FromShape(shapes.Make(v.Shape.DType, B, S, v.Shape.Dimensions[1]))
	var rerr error
	if err := x.MutableBytes(func(b []byte) { rerr = g.src.readRows(ctx, *v, rows, zd, b) }); err != nil {
		finalize(x)
		return nil, err
	}
	if rerr != nil {
		finalize(x)
		return nil, rerr
	}
	return x, nil
}

// beginLayer makes layer l's weights readable and swaps them into their
// slots (the token embedding, read by rows, excepted).
func (g *Generator) beginLayer(ctx context.Context, l int) error {
	if err := g.src.beginLayer(ctx, l); err != nil {
		return err
	}
	if l == 0 && g.rowsOf != nil {
		return nil
	}
	for _, i := range g.byLayer[l] {
		v := g.vars[i]
		s := g.slots[v.rel]
		if err := g.src.readParam(ctx, v, s.dtype, s.bytes); err != nil {
			g.src.endLayer(l)
			return err
		}
	}
	return nil
}

// call runs an executor, turning a panic into an error.
func call(e *model.Exec, args ...any) (out []*tensors.Tensor, err error) {
	err = catch(func() error {
		var err error
		out, err = e.Call(args...)
		return err
	})
	return out, err
}

// finalize releases a tensor's memory now (nil is fine; see
// layerexec.Finalize).
func finalize(t *tensors.Tensor) { layerexec.Finalize(t) }

// kvState is the batch's KV cache: per transformer layer a key and a
// value tensor [batch, kv heads, cache length, head dim], of GoMLX's
// kvcache layout and bucketed lengths, kept in a zinf KV cache on the tier
// zinf.kv_cache chooses (memory, pinned, NVMe), one entry per layer
// (keys, then values), read back for its layer just ahead of use.
type kvState struct {
	g     *Generator
	c     kvCache
	batch int
	cur   []int  // each layer's cache length now
	next  []int  // for the pass running
	buf   []byte // the entry of the layer begun
}

// kvLen is the bucketed cache length of layer l for a sequence of n.
func (g *Generator) kvLen(l, n int) int {
	c := g.m.KVCache
	return c.CacheSeqLen(c.GetLayerType(c.OrderedScopes[l]), n)
}

func (g *Generator) kvShape(batch, n int) shapes.Shape {
	return shapes.Make(g.m.DType, batch, g.kvHeads, n, g.m.HeadDim)
}

// openKV opens the cache of a batch whose prefill covers promptLen
// tokens and whose sequences reach total.
func (g *Generator) openKV(batch, promptLen, total int) (*kvState, error) {
	L := g.m.NumLayers
	s := &kvState{g: g, batch: batch, cur: make([]int, L), next: make([]int, L)}
	var most int64
	for l := range L {
		s.cur[l] = g.kvLen(l, promptLen)
		most = max(most, 2*g.kvShape(batch, max(s.cur[l], g.kvLen(l, total))).ByteSize())
	}
	c, err := g.src.openKV(L, most)
	if err != nil {
		return nil, err
	}
	s.c = c
	return s, nil
}

// grow sets the cache lengths of a pass ending at position end (GoMLX's
// generator pads to the bucket of the last position written).
func (s *kvState) grow(end int) {
	for l := range s.cur {
		s.next[l] = max(s.cur[l], s.g.kvLen(l, end-1))
	}
}

// load makes layer l's keys and values tensors of the pass's length.
func (s *kvState) load(ctx context.Context, l int) (k, v *tensors.Tensor, err error) {
	b, err := s.c.Begin(ctx, l)
	if err != nil {
		return nil, nil, err
	}
	s.buf = b
	defer func() {
		if err != nil {
			s.abandon(l)
		}
	}()
	shape := s.g.kvShape(s.batch, s.cur[l])
	n := int(shape.ByteSize())
	k, v = tensors.FromShape(shape), tensors.FromShape(shape)
	if err := errors.Join(k.MutableBytes(func(d []byte) { copy(d, b[:n]) }), v.MutableBytes(func(d []byte) { copy(d, b[n:2*n]) })); err != nil {
		finalize(k)
		finalize(v)
		return nil, nil, err
	}
	if s.next[l] > s.cur[l] {
		c := s.g.m.KVCache
		path := c.OrderedScopes[l]
		in := kvcache.KVCacheTensors{path + kvcache.KeySuffix: k, path + kvcache.ValueSuffix: v}
		out, err := c.PadTensors(in, s.next[l]-1)
		if err == nil && out[path+kvcache.KeySuffix].Shape().Dimensions[2] != s.next[l] {
			err = fmt.Errorf("padded KV cache of layer %d has %s, want length %d", l, out[path+kvcache.KeySuffix].Shape(), s.next[l])
		}
		for key, t := range out {
			if in[key] != t {
				finalize(in[key])
			}
		}
		if err != nil {
			finalize(out[path+kvcache.KeySuffix])
			finalize(out[path+kvcache.ValueSuffix])
			return nil, nil, err
		}
		k, v = out[path+kvcache.KeySuffix], out[path+kvcache.ValueSuffix]
	}
	return k, v, nil
}

// store writes layer l's new keys and values back into its entry and
// hands it back.
func (s *kvState) store(l int, k, v *tensors.Tensor) error {
	defer finalize(k)
	defer finalize(v)
	n := int(k.Shape().ByteSize())
	if 2*n > len(s.buf) || !k.Shape().Equal(v.Shape()) {
		s.abandon(l)
		return fmt.Errorf("KV cache of layer %d: keys %s and values %s do not fit its %d bytes", l, k.Shape(), v.Shape(), len(s.buf))
	}
	if err := errors.Join(k.ConstBytes(func(d []byte) { copy(s.buf[:n], d) }), v.ConstBytes(func(d []byte) { copy(s.buf[n:2*n], d) })); err != nil {
		s.abandon(l)
		return err
	}
	s.cur[l] = k.Shape().Dimensions[2]
	s.buf = nil
	return s.c.End(l, 2*n)
}

// abandon hands layer l's entry back unchanged (a failed pass).
func (s *kvState) abandon(l int) {
	if s.buf != nil {
		s.buf = nil
		_ = s.c.End(l, 0)
	}
}

func (s *kvState) free() error {
	if s == nil || s.c == nil {
		return nil
	}
	return s.c.Close()
}

// advance moves every sequence of a batch on after a pass at position pos
// gave next: a sequence still reading its prompt takes the prompt's next
// token, an ended one runs on unused, the others keep next (ending at an
// EOS or stop token). It sets in for the next pass and reports the tokens
// kept (-1: none) and whether every sequence has ended. The GoMLX and
// native loops share it.
func advance(prompts [][]int32, pos int, next []int32, s Sampling, res *Result, done []bool, in [][]int32) (report []int32, allDone bool) {
	report = make([]int32, len(prompts))
	allDone = true
	for i, p := range prompts {
		report[i] = -1
		switch {
		case pos < len(p): // still reading its prompt
			in[i] = p[pos : pos+1]
		case done[i] || len(res.Tokens[i]) >= s.MaxNewTokens:
			in[i] = []int32{0} // ended: its row runs on, unused
		default:
			res.Tokens[i] = append(res.Tokens[i], next[i])
			report[i] = next[i]
			in[i] = []int32{next[i]}
			if s.ends(next[i]) {
				done[i] = true
			}
		}
		if !done[i] && len(res.Tokens[i]) < s.MaxNewTokens {
			allDone = false
		}
	}
	return report, allDone
}

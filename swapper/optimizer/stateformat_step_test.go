package optimizer_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"testing"

	"github.com/zinfio/zinf/buffers"
	"github.com/zinfio/zinf/swapper/optimizer"
)

// compressedRef is the in-memory reference of Adam over compressed
// moments: whole tensors stepped with Adam8Step or AdamBF16Step.
type compressedRef struct {
	f      optimizer.StateFormat
	p      map[string][]float32
	qm, qv map[string][]uint8
	am, av map[string][]float32
	bm, bv map[string][]buffers.BFloat16
}

func newCompressedRef(f optimizer.StateFormat, md *model) *compressedRef {
	r := &compressedRef{f: f, p: map[string][]float32{}, qm: map[string][]uint8{}, qv: map[string][]uint8{},
		am: map[string][]float32{}, av: map[string][]float32{}, bm: map[string][]buffers.BFloat16{}, bv: map[string][]buffers.BFloat16{}}
	for _, s := range md.specs {
		r.p[s.name] = append([]float32(nil), md.p[s.name]...)
		blocks := optimizer.FormatBlockwise8.Blocks(int64(s.n))
		zeros := make([]float32, s.n)
		r.qm[s.name], r.qv[s.name] = make([]uint8, s.n), make([]uint8, s.n)
		r.am[s.name], r.av[s.name] = make([]float32, blocks), make([]float32, blocks)
		optimizer.SignedDynamicMap().Quantize(r.qm[s.name], r.am[s.name], zeros)
		optimizer.UnsignedDynamicMap().Quantize(r.qv[s.name], r.av[s.name], zeros)
		r.bm[s.name], r.bv[s.name] = make([]buffers.BFloat16, s.n), make([]buffers.BFloat16, s.n)
	}
	return r
}

// step applies one step (number step) with params p to every tensor.
func (r *compressedRef) step(md *model, g map[string][]float32, step int, p optimizer.StepParams) {
	for _, s := range md.specs {
		gc := append([]float32(nil), g[s.name]...)
		if r.f == optimizer.FormatBF16 {
			optimizer.AdamBF16Step(r.p[s.name], gc, r.bm[s.name], r.bv[s.name], step, md.h, p)
			continue
		}
		optimizer.Adam8Step(r.p[s.name], gc, r.qm[s.name], r.qv[s.name], r.am[s.name], r.av[s.name], step, md.h, p)
	}
}

// decoded returns the reference's moments of name as fp32.
func (r *compressedRef) decoded(name string) (m, v []float32) {
	n := len(r.p[name])
	m, v = make([]float32, n), make([]float32, n)
	if r.f == optimizer.FormatBF16 {
		buffers.BFloat16ToFloat32(m, r.bm[name])
		buffers.BFloat16ToFloat32(v, r.bv[name])
		return m, v
	}
	optimizer.SignedDynamicMap().Dequantize(m, r.qm[name], r.am[name])
	optimizer.UnsignedDynamicMap().Dequantize(v, r.qv[name], r.av[name])
	return m, v
}

// clippedParams are a step's parameters with DeepSpeed's gradient
// clipping: the factor from the global norm of g.
func clippedParams(g map[string][]float32, step int) optimizer.StepParams {
	var sum float64
	for _, name := range sortedKeys(g) {
		sum += optimizer.SumSquares(g[name])
	}
	f, _, _ := optimizer.GradFactor(sum, 1, 0.5)
	return optimizer.StepParams{LR: 1e-3 * float32(1+step%3), ScaleGrads: true, GradScale: f}
}

func sortedKeys(m map[string][]float32) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	for i := range out {
		for j := i + 1; j < len(out); j++ {
			if out[j] < out[i] {
				out[i], out[j] = out[j], out[i]
			}
		}
	}
	return out
}

// TestCompressedStatesBitForBit: an optimizer whose Adam moments are
// stored 8-bit blockwise or bf16 (Options.StateFormat), on NVMe or in
// pinned memory, pipelined or not, with the update split over workers,
// gives after every step exactly the bits of the in-memory reference
// (Adam8Step / AdamBF16Step on whole tensors) with clipping and a
// changing learning rate: the masters it publishes, the moments it reads
// back decoded, and the encoded states (ReadEncodedStates). Midway the
// states are read encoded, loaded into a fresh optimizer
// (LoadEncodedStates: a checkpoint's resume), and the run goes on there
// with the same bits.
func TestCompressedStatesBitForBit(t *testing.T) {
	specs := []spec{{"big", 300_000}, {"mid", 70_000}, {"odd", 1000}, {"tiny", 3}}
	for _, f := range []optimizer.StateFormat{optimizer.FormatBlockwise8, optimizer.FormatBF16} {
		for _, memory := range []bool{false, true} {
			for _, depth := range []int{0, 2} {
				name := fmt.Sprintf("%s/memory=%v/depth=%d", f, memory, depth)
				t.Run(name, func(t *testing.T) {
					cfg := rigConfig{memory: memory, poolBytes: 64 << 20, specs: specs, seed: 7,
						opts: optimizer.Options{SubGroupSize: 131_328, PipelineDepth: depth, UpdateWorkers: 2, StateFormat: f,
							Hyper: optimizer.Hyper{LR: 1e-3, AdamW: true, WeightDecay: 0.01}}}
					r := newRig(t, cfg)
					ref := newCompressedRef(f, r.md)
					ctx := context.Background()
					const steps, resumeAt = 6, 3
					for step := 1; step <= steps; step++ {
						g := r.md.grads(step)
						p := clippedParams(g, step)
						r.grads.set(g)
						if err := r.opt.StepWith(ctx, p); err != nil {
							t.Fatalf("step %d: %v", step, err)
						}
						ref.step(r.md, g, step, p)
						checkCompressed(t, fmt.Sprintf("step %d", step), r, ref)
						if step == resumeAt {
							r = resumeCompressed(t, r, cfg)
						}
					}
				})
			}
		}
	}
}

// checkCompressed compares r's published masters, decoded and encoded
// states with the reference's, bit for bit.
func checkCompressed(t *testing.T, label string, r *rig, ref *compressedRef) {
	t.Helper()
	pub := r.sink.snapshot()
	ctx := context.Background()
	for _, s := range r.cfg.specs {
		if i := firstDiff(pub[s.name], ref.p[s.name]); i >= 0 {
			t.Fatalf("%s: %s: published master differs at %d: %#x want %#x", label, s.name, i, bits(pub[s.name], i), bits(ref.p[s.name], i))
		}
		master, m, v, err := r.opt.ReadState(ctx, s.name)
		if err != nil {
			t.Fatal(err)
		}
		wm, wv := ref.decoded(s.name)
		for _, c := range []struct {
			what      string
			got, want []float32
		}{{"master", master, ref.p[s.name]}, {"exp_avg", m, wm}, {"exp_avg_sq", v, wv}} {
			if i := firstDiff(c.got, c.want); i >= 0 {
				t.Fatalf("%s: %s: %s differs at %d: %#x want %#x", label, s.name, c.what, i, bits(c.got, i), bits(c.want, i))
			}
		}
		_, enc, err := r.opt.ReadEncodedStates(ctx, s.name)
		if err != nil {
			t.Fatal(err)
		}
		if ref.f == optimizer.FormatBF16 {
			for k, want := range [][]buffers.BFloat16{ref.bm[s.name], ref.bv[s.name]} {
				if string(enc[k].Data) != string(buffers.AsBytes(want)) || enc[k].Absmax != nil {
					t.Fatalf("%s: %s: encoded state %d differs from the reference", label, s.name, k)
				}
			}
			continue
		}
		for k, want := range []struct {
			codes  []uint8
			absmax []float32
		}{{ref.qm[s.name], ref.am[s.name]}, {ref.qv[s.name], ref.av[s.name]}} {
			if string(enc[k].Data) != string(want.codes) || firstDiff(enc[k].Absmax, want.absmax) >= 0 || len(enc[k].Absmax) != len(want.absmax) {
				t.Fatalf("%s: %s: encoded state %d (codes and absmax) differs from the reference", label, s.name, k)
			}
		}
	}
}

// resumeCompressed reads r's states encoded, as a checkpoint keeps them,
// and returns a fresh rig of cfg with them loaded at r's step.
func resumeCompressed(t *testing.T, r *rig, cfg rigConfig) *rig {
	t.Helper()
	ctx := context.Background()
	type saved struct {
		master []float32
		states []optimizer.EncodedState
	}
	ck := map[string]saved{}
	for _, s := range cfg.specs {
		m, st, err := r.opt.ReadEncodedStates(ctx, s.name)
		if err != nil {
			t.Fatal(err)
		}
		ck[s.name] = saved{m, st}
	}
	step := r.opt.StepCount()
	pub := r.sink.snapshot()
	if err := r.opt.Close(); err != nil {
		t.Fatal(err)
	}
	nr := newRig(t, cfg)
	for _, s := range cfg.specs {
		if err := nr.opt.LoadEncodedStates(ctx, s.name, ck[s.name].master, ck[s.name].states, step); err != nil {
			t.Fatal(err)
		}
		nr.sink.committed[s.name] = pub[s.name]
	}
	nr.md = r.md
	return nr
}

// TestCompressedStatesFormats checks the record bytes of each format, the
// Options rules of compressed states and LoadEncodedStates' refusals.
func TestCompressedStatesFormats(t *testing.T) {
	for _, c := range []struct {
		f    optimizer.StateFormat
		want int64 // record bytes of 1000 elements, back to back
	}{{optimizer.FormatFP32, 12000}, {optimizer.FormatBF16, 8000}, {optimizer.FormatBlockwise8, 4000 + 2*(1000+4*4)}} {
		l := optimizer.LayoutForFormat(1000, 3, c.f)
		if l.Bytes != c.want || l.Bytes != c.f.RecordBytes(optimizer.Hyper{}, 1000) {
			t.Errorf("%s: record of 1000 elements is %d bytes, want %d", c.f, l.Bytes, c.want)
		}
	}
	if a, b := optimizer.LayoutForFormat(1<<20, 3, optimizer.FormatFP32), optimizer.LayoutForArrays(1<<20, 3); a != b {
		t.Errorf("fp32 layout changed: %+v, was %+v", a, b)
	}
	pool, err := buffers.NewPool(buffers.Options{CapacityBytes: 1 << 20, Pin: buffers.PinOff})
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	for _, c := range []struct {
		opts optimizer.Options
		want string
	}{
		{optimizer.Options{StateFormat: optimizer.FormatBlockwise8, SubGroupSize: 1000}, "Options.SubGroupSize = 1000: with 8-bit states it must be a multiple of 256"},
		{optimizer.Options{StateFormat: optimizer.FormatBF16, Hyper: optimizer.Hyper{Rule: optimizer.RuleLion}}, "compressed states are implemented for Adam only"},
		{optimizer.Options{StateFormat: optimizer.StateFormat{Encoding: 7}}, "Options.StateFormat"},
	} {
		c.opts.Pool, c.opts.Grads = pool, &fakeGrads{}
		if _, err := optimizer.New(c.opts); err == nil || !contains(err.Error(), c.want) {
			t.Errorf("New(%+v): %v, want an error with %q", c.opts.StateFormat, err, c.want)
		}
	}
	r := newRig(t, rigConfig{memory: true, specs: []spec{{"w", 600}}, seed: 1,
		opts: optimizer.Options{SubGroupSize: 512, StateFormat: optimizer.FormatBlockwise8, Hyper: optimizer.Hyper{LR: 1e-3}}})
	ctx := context.Background()
	master, st, err := r.opt.ReadEncodedStates(ctx, "w")
	if err != nil {
		t.Fatal(err)
	}
	if len(st) != 2 || len(st[0].Data) != 600 || len(st[0].Absmax) != 3 {
		t.Fatalf("encoded states: %d states, %d codes, %d absmax; want 2, 600, 3", len(st), len(st[0].Data), len(st[0].Absmax))
	}
	bf := []optimizer.EncodedState{{Format: optimizer.FormatBF16, Data: make([]byte, 1200)}, {Format: optimizer.FormatBF16, Data: make([]byte, 1200)}}
	if err := r.opt.LoadEncodedStates(ctx, "w", master, bf, 0); !errors.Is(err, optimizer.ErrFormat) {
		t.Errorf("loading bf16 states into an 8-bit optimizer: %v, want ErrFormat", err)
	}
	st[1].Absmax = st[1].Absmax[:2]
	if err := r.opt.LoadEncodedStates(ctx, "w", master, st, 0); !errors.Is(err, optimizer.ErrLength) {
		t.Errorf("loading states with too few absmax: %v, want ErrLength", err)
	}
	for k, s := range st[:1] {
		d, err := s.Decode(optimizer.StateKind(k + 1))
		if err != nil || len(d) != 600 || math.Float32bits(d[0]) != 0 {
			t.Errorf("Decode: %v (%d values)", err, len(d))
		}
	}
}

func contains(s, sub string) bool {
	for i := 0; i+len(sub) <= len(s); i++ {
		if s[i:i+len(sub)] == sub {
			return true
		}
	}
	return false
}

// TestStateFormatFor: with a KeepFP32 rule, tensors under the size
// threshold and those whose name matches a pattern keep fp32 states and
// the others 8-bit ones, in one optimizer: each steps exactly as its
// format's reference (AdamStep, Adam8Step), and StateFormatOf and the
// state bytes say which is which.
func TestStateFormatFor(t *testing.T) {
	specs := []spec{{"layer.w", 9000}, {"tok_embed.weight", 8192}, {"layer.b", 100}}
	rule := optimizer.KeepFP32(optimizer.FormatBlockwise8, optimizer.MinCompressedElems, []string{"*embed*"})
	r := newRig(t, rigConfig{poolBytes: 16 << 20, specs: specs, seed: 3,
		opts: optimizer.Options{SubGroupSize: 4096, StateFormatFor: rule, Hyper: optimizer.Hyper{LR: 1e-3}}})
	want := map[string]optimizer.StateFormat{"layer.w": optimizer.FormatBlockwise8, "tok_embed.weight": optimizer.FormatFP32, "layer.b": optimizer.FormatFP32}
	var bytes int64
	for _, s := range specs {
		f, ok := r.opt.StateFormatOf(s.name)
		if !ok || f != want[s.name] {
			t.Errorf("%s: format %v (%v), want %v", s.name, f, ok, want[s.name])
		}
		bytes += f.RecordBytes(optimizer.Hyper{}, int64(s.n))
	}
	if got := r.opt.Stats().StateBytes; got != bytes {
		t.Errorf("StateBytes %d, want %d", got, bytes)
	}
	ref := newCompressedRef(optimizer.FormatBlockwise8, r.md)
	ctx := context.Background()
	for step := 1; step <= 3; step++ {
		g := r.md.grads(step)
		p := clippedParams(g, step)
		r.grads.set(g)
		if err := r.opt.StepWith(ctx, p); err != nil {
			t.Fatal(err)
		}
		for _, s := range specs {
			gc := append([]float32(nil), g[s.name]...)
			if want[s.name] == optimizer.FormatFP32 {
				optimizer.AdamStep(r.md.p[s.name], gc, r.md.m[s.name], r.md.v[s.name], step, r.md.h, p)
				continue
			}
			optimizer.Adam8Step(ref.p[s.name], gc, ref.qm[s.name], ref.qv[s.name], ref.am[s.name], ref.av[s.name], step, r.md.h, p)
		}
	}
	pub := r.sink.snapshot()
	for _, s := range specs {
		w := ref.p[s.name]
		if want[s.name] == optimizer.FormatFP32 {
			w = r.md.p[s.name]
		}
		if i := firstDiff(pub[s.name], w); i >= 0 {
			t.Errorf("%s (%v): master differs at %d", s.name, want[s.name], i)
		}
	}
	for _, c := range []struct {
		pattern, name string
		want          bool
	}{
		{"*embed*", "/token_embed/embeddings", true}, {"*embed*", "tok_embed.weight", true}, {"*embed*", "layer.w", false},
		{"/layer_?/*", "/layer_3/w", true}, {"/layer_?/*", "/layer_12/w", false}, {"*", "", true}, {"", "a", false},
		{"a*b*c", "axxbyyc", true}, {"a*b*c", "axxbyy", false}, {"*.bias", "l0.bias", true}, {"[a-", "[a-", true},
	} {
		if got := optimizer.MatchName(c.pattern, c.name); got != c.want {
			t.Errorf("MatchName(%q, %q) = %v, want %v", c.pattern, c.name, got, c.want)
		}
	}
}

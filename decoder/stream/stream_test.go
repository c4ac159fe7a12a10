package stream_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/zinfio/zinf/config"
	"github.com/zinfio/zinf/decoder"
	"github.com/zinfio/zinf/decoder/kernels"
	"github.com/zinfio/zinf/decoder/stream"
	"github.com/zinfio/zinf/gguf"
)

// writeModel writes a llama model of random weights, its matrices in t
// (norms f32), tied to the embedding when tied.
func writeModel(t *testing.T, dir string, typ kernels.DType, tied bool) (string, decoder.Config) {
	t.Helper()
	shape := gguf.ModelShape{Dim: 64, Layers: 3, Heads: 4, KVHeads: 2, HeadDim: 16, FFNDim: 96, RoPEBase: 10000, NormEps: 1e-5}
	c := decoder.Config{Vocab: 320, Dim: shape.Dim, Layers: shape.Layers, Heads: shape.Heads, KVHeads: shape.KVHeads,
		HeadDim: shape.HeadDim, FFNDim: shape.FFNDim, Block: decoder.PreNorm, Norm: decoder.RMSNorm, FinalNorm: decoder.RMSNorm,
		NormEps: shape.NormEps, Activation: decoder.SiLU, Gated: true, RoPEBase: shape.RoPEBase, RoPEInterleaved: true, TiedHead: tied}
	w := gguf.NewWriter()
	if err := errors.Join(w.SetLlama("stream-test", shape, 256), w.SetByteVocab(c.Vocab)); err != nil {
		t.Fatal(err)
	}
	names, err := c.Names(decoder.GGUFNames, "")
	if err != nil {
		t.Fatal(err)
	}
	for i, n := range names {
		s := c.Shape(n.Role)
		mt := kernels.F32
		if len(s) == 2 {
			mt = typ
		}
		gt, err := gguf.TypeOf(mt)
		if err != nil {
			t.Fatal(err)
		}
		rng := rand.New(rand.NewPCG(7, uint64(i)))
		size := 1
		for _, d := range s {
			size *= d
		}
		v := make([]float32, size)
		mean, sd := 1.0, 0.1
		if len(s) == 2 {
			mean, sd = 0, 1/math.Sqrt(float64(s[1]))
		}
		for j := range v {
			v[j] = float32(mean + sd*rng.NormFloat64())
		}
		b, err := kernels.Encode(mt, v)
		if err != nil {
			t.Fatal(err)
		}
		if err := w.AddTensor(n.Name, gt, s, b); err != nil {
			t.Fatal(err)
		}
	}
	path := filepath.Join(dir, "model-"+typ.String()+".gguf")
	if err := w.WriteFile(path); err != nil {
		t.Fatal(err)
	}
	return path, c
}

// inMemory decodes greedily with every weight read into memory: the
// reference.
func inMemory(t *testing.T, path string, prompts [][]int32, steps int) [][]float32 {
	t.Helper()
	f, err := gguf.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	m, err := f.Model()
	if err != nil {
		t.Fatal(err)
	}
	mw, layers, err := f.Weights(m.Config, nil)
	if err != nil {
		t.Fatal(err)
	}
	return decode(t, m.Config, prompts, steps, func(d *decoder.Decoder, cache *decoder.KVCache, toks [][]int32, pos []int, logits []float32) error {
		if err := d.Begin(cache, toks, pos, &mw); err != nil {
			return err
		}
		for l := range m.Config.Layers {
			if err := d.Layer(l, &layers[l]); err != nil {
				return err
			}
		}
		return d.Logits(&mw, logits)
	})
}

// decode runs the prompts' prefill and steps greedy steps through pass,
// returning every pass's logits.
func decode(t *testing.T, c decoder.Config, prompts [][]int32, steps int, pass func(*decoder.Decoder, *decoder.KVCache, [][]int32, []int, []float32) error) [][]float32 {
	t.Helper()
	d, err := decoder.New(c, nil)
	if err != nil {
		t.Fatal(err)
	}
	batch := len(prompts)
	kvh := c.KVHeads
	if kvh == 0 {
		kvh = c.Heads
	}
	maxLen := len(prompts[0]) + steps + 1
	n := c.Layers * batch * maxLen * kvh * c.HeadDim
	cache, err := decoder.NewKVCache(c, batch, maxLen, make([]float32, n), make([]float32, n))
	if err != nil {
		t.Fatal(err)
	}
	pos := make([]int, batch)
	toks := prompts
	var out [][]float32
	for range steps + 1 {
		logits := make([]float32, batch*c.Vocab)
		if err := pass(d, cache, toks, pos, logits); err != nil {
			t.Fatal(err)
		}
		out = append(out, logits)
		next := make([][]int32, batch)
		for b := range next {
			pos[b] += len(toks[b])
			row := logits[b*c.Vocab : (b+1)*c.Vocab]
			next[b] = []int32{int32(slices.Index(row, slices.Max(row)))}
		}
		toks = next
	}
	return out
}

// streamConfig is the embedded default with its NVMe path in dir, a pool
// of pool bytes and keep bytes of weights kept in it (max_in_cpu counts
// 2-byte words).
func streamConfig(t *testing.T, dir string, pool, keep int64) *config.Config {
	t.Helper()
	cfg := config.Default()
	cfg.SetScratchDir(dir)
	cfg.Zinf.Tiers.CPUPinnedBytes = config.Size(pool)
	cfg.ZeroOptimization.OffloadParam.MaxInCPU = keep / 2
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	return cfg
}

// TestStreamEqualsInMemory decodes the same prompts from a GGUF file
// twice, every weight in memory and every weight streamed through a
// small pool (some kept in it, or none), and wants the same logits bit
// for bit, for each stored type, tied and untied heads, batch 1 and 3.
func TestStreamEqualsInMemory(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	for _, typ := range []kernels.DType{kernels.F32, kernels.BF16, kernels.Q8_0, kernels.Q4_0} {
		for _, tied := range []bool{false, true} {
			for _, keep := range []int64{0, 64 << 10} {
				t.Run(fmt.Sprintf("%v/tied=%v/keep=%d", typ, tied, keep), func(t *testing.T) {
					dir := t.TempDir()
					path, c := writeModel(t, dir, typ, tied)
					prompts := [][]int32{{1, 70, 71, 72}}
					if !tied {
						prompts = [][]int32{{1, 70, 71, 72}, {1, 5, 6, 300}, {1, 200, 201, 9}}
					}
					want := inMemory(t, path, prompts, 5)
					m, err := stream.Open(ctx, path, streamConfig(t, dir, 8<<20, keep), stream.Options{NoBandwidthProbe: true})
					if err != nil {
						t.Fatal(err)
					}
					defer m.Close()
					if m.Config().TiedHead != c.TiedHead {
						t.Fatalf("tied head %v, wrote %v", m.Config().TiedHead, c.TiedHead)
					}
					got := decode(t, m.Config(), prompts, 5, func(d *decoder.Decoder, cache *decoder.KVCache, toks [][]int32, pos []int, logits []float32) error {
						return m.Pass(ctx, d, cache, toks, pos, logits)
					})
					m.EndPasses()
					for p := range want {
						for i := range want[p] {
							if math.Float32bits(got[p][i]) != math.Float32bits(want[p][i]) {
								t.Fatalf("pass %d logit %d: streamed %v, in memory %v", p, i, got[p][i], want[p][i])
							}
						}
					}
					s := m.Stats()
					t.Logf("%+v", s)
					if s.Passes != 6 {
						t.Errorf("Stats.Passes %d, want 6", s.Passes)
					}
					if keep == 0 && s.KeptBytes != 0 {
						t.Errorf("kept %d bytes with max_in_cpu 0", s.KeptBytes)
					}
					if keep > 0 && (s.KeptBytes == 0 || s.KeptBytes > keep) {
						t.Errorf("kept %d bytes with max_in_cpu %d bytes", s.KeptBytes, keep)
					}
					// Every streamed byte is read by every pass (the kept
					// ones once): at least passes x streamed.
					if min := int64(s.Passes) * s.StreamedBytes; s.BytesRead < min {
						t.Errorf("read %d bytes, want at least %d passes x %d streamed", s.BytesRead, s.Passes, s.StreamedBytes)
					}
				})
			}
		}
	}
}

// TestStreamFloor checks that Floor predicts from the streamed bytes at
// the plan's bandwidth.
func TestStreamFloor(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	dir := t.TempDir()
	path, _ := writeModel(t, dir, kernels.Q8_0, false)
	cfg := streamConfig(t, dir, 8<<20, 0)
	cfg.Zinf.Bandwidth.ReadBytesPerSec = 1e9 // the plan's figure, no probe
	cfg.Zinf.Bandwidth.WriteBytesPerSec = 1e9
	m, err := stream.Open(ctx, path, cfg, stream.Options{NoBandwidthProbe: true})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	g, err := m.Floor(1, 16, time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	s := m.Stats()
	wantIO := time.Duration(float64(s.StreamedBytes) / 1e9 * float64(time.Second))
	if d := g.WeightIO - wantIO; d < -time.Microsecond || d > time.Microsecond {
		t.Errorf("floor's weight I/O %v, want %d streamed bytes at 1000 MB/s = %v", g.WeightIO, s.StreamedBytes, wantIO)
	}
	if g.Step != max(g.WeightIO, time.Millisecond) {
		t.Errorf("floor %v, want the longer of %v I/O and 1ms compute", g.Step, g.WeightIO)
	}
}

// TestStreamRefuses checks Open's refusals: fp16.enabled, weights not on
// the nvme tier, an absent file, no config.
func TestStreamRefuses(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	path, _ := writeModel(t, dir, kernels.F32, false)
	cfg := streamConfig(t, dir, 8<<20, 0)
	cfg.FP16 = true
	if _, err := stream.Open(ctx, path, cfg, stream.Options{NoBandwidthProbe: true}); err == nil || !strings.Contains(err.Error(), "fp16.enabled") {
		t.Errorf("fp16.enabled: %v, want a refusal naming the key", err)
	}
	cfg.FP16 = false
	cfg.ZeroOptimization.OffloadParam.Device = config.OffloadCPU
	if _, err := stream.Open(ctx, path, cfg, stream.Options{NoBandwidthProbe: true}); err == nil || !strings.Contains(err.Error(), "offload_param.device") {
		t.Errorf("offload_param.device cpu: %v, want a refusal naming the key", err)
	}
	cfg.ZeroOptimization.OffloadParam.Device = config.OffloadNVMe
	if _, err := stream.Open(ctx, filepath.Join(dir, "absent.gguf"), cfg, stream.Options{NoBandwidthProbe: true}); err == nil {
		t.Error("an absent file opened")
	}
	if _, err := stream.Open(ctx, path, nil, stream.Options{}); err == nil {
		t.Error("a nil config opened")
	}
}

package generate_test

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gomlx/compute/dtypes"
	"github.com/gomlx/gomlx/ml/layers/activation"
	"github.com/gomlx/gomlx/ml/model"
	"github.com/gomlx/gomlx/ml/zoo/transformer"

	"github.com/zinfio/zinf"
	"github.com/zinfio/zinf/checkpoint"
	"github.com/zinfio/zinf/contrib/gomlx/generate"
	"github.com/zinfio/zinf/tensor"
)

// varsOf lists a model's variables as the generator sees them.
func varsOf(t *testing.T, ctx context.Context, fn generate.ModelFn, w generate.Weights) []generate.Var {
	t.Helper()
	g, err := generate.Open(ctx, backend(t), nvmeConfig(t, 4<<20, false), fn, w, generate.Options{Logger: quiet, NoBandwidthProbe: true})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	return g.Vars()
}

// TestCheckpointWeights: a zinf checkpoint's parameters (bf16, named by
// their variable paths) generate what the same weights do in memory.
func TestCheckpointWeights(t *testing.T) {
	ctx := watchdog(t, 4*time.Minute)
	t.Setenv("GOMLX_FUSION", "false")
	be := backend(t)
	fn := tiny(dtypes.BFloat16, 2)
	store, err := generate.InitStore(be, fn, 21)
	if err != nil {
		t.Fatal(err)
	}
	w := generate.StoreWeights(store)
	var ts []checkpoint.Tensor
	for _, v := range varsOf(t, ctx, fn, w) {
		f := make([]float32, v.Numel())
		if err := w.Read(ctx, v, f); err != nil {
			t.Fatal(err)
		}
		b := make([]byte, 2*len(f))
		for i, x := range f {
			binary.LittleEndian.PutUint16(b[2*i:], uint16(math.Float32bits(x)>>16))
		}
		shape := make([]int64, v.Shape.Rank())
		for i, d := range v.Shape.Dimensions {
			shape[i] = int64(d)
		}
		ts = append(ts, checkpoint.FromBytes(v.Name, tensor.BFloat16, shape, b))
	}
	root := t.TempDir()
	dir := filepath.Join(root, "step-000100")
	if _, err := checkpoint.Save(ctx, dir, checkpoint.State{Step: 100, Ranks: []checkpoint.RankState{{Rank: 0,
		Files: []checkpoint.TensorFile{{Name: zinf.CheckpointParamsFile, Tensors: ts}}}}}, checkpoint.SaveOptions{}); err != nil {
		t.Fatal(err)
	}
	cw, err := generate.CheckpointWeights(root) // the root: its newest checkpoint
	if err != nil {
		t.Fatal(err)
	}
	defer cw.Close()
	if cw.Dir != dir {
		t.Fatalf("read %s, want the newest checkpoint %s", cw.Dir, dir)
	}
	g, err := generate.Open(ctx, be, nvmeConfig(t, 4<<20, true), fn, cw, generate.Options{Logger: quiet, NoBandwidthProbe: true})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	checkInPlace(t, g, 2, len(g.Vars())) // every tensor, wherever the checkpoint packed it
	ps, s := prompts(2, 5, 97, 4), generate.Sampling{MaxNewTokens: 12}
	res, err := g.Generate(ctx, ps, s, nil)
	if err != nil {
		t.Fatal(err)
	}
	want, err := generate.InMemory(ctx, be, fn, w, ps, s)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.EqualFunc(res.Tokens, want, slices.Equal) {
		t.Fatalf("from the checkpoint %v, in memory %v", res.Tokens, want)
	}

	// A newer checkpoint whose checkpoint.json is damaged is an error
	// naming it, as for --resume: never passed over for the older one.
	newer := filepath.Join(root, "step-000200")
	if err := os.MkdirAll(newer, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(newer, "checkpoint.json"), []byte(`{"format": "zinf-ch`), 0o644); err != nil {
		t.Fatal(err)
	}
	if cw2, err := generate.CheckpointWeights(root); err == nil {
		cw2.Close()
		t.Fatalf("a damaged newest checkpoint was passed over for %s", cw2.Dir)
	} else if !strings.Contains(err.Error(), "step-000200") {
		t.Fatalf("error does not name the damaged checkpoint: %v", err)
	}
}

// gemmaHF is the zoo transformer in the layout of a Hugging Face Gemma
// checkpoint: pre- and post-norms, a gated MLP, PyTorch's [out, in]
// projections.
func gemmaHF(root *model.Scope) *transformer.Model {
	return transformer.New(root.In("model")).WithArchitecture(transformer.ArchitectureGemma).WithTransposedWeights(true).
		WithVocabSize(97).WithEmbedDim(32).WithNumLayers(2).WithNumHeads(4).WithNumKVHeads(2).WithHeadDim(8).
		WithFFNDim(48).WithRoPE(10000).WithNormalization("rms").WithFinalNormalization("rms").
		WithActivation(activation.TypeGelu).WithBias(false).WithDType(dtypes.Float32)
}

// writeHF writes w's weights as one safetensors file under Hugging Face
// names (HFNames), lm_head as PyTorch holds it.
func writeHF(t *testing.T, ctx context.Context, path string, vars []generate.Var, w generate.Weights) {
	t.Helper()
	header := map[string]any{"__metadata__": map[string]string{"format": "pt"}}
	var data []byte
	for _, v := range vars {
		f := make([]float32, v.Numel())
		if err := w.Read(ctx, v, f); err != nil {
			t.Fatal(err)
		}
		name, transposed := generate.HFNames(v)
		if name == v.Name {
			t.Fatalf("HFNames has no name for %q", v.Name)
		}
		shape := []int{v.Shape.Dimensions[0]}
		if v.Shape.Rank() == 2 {
			shape = append(shape, v.Shape.Dimensions[1])
		}
		if transposed {
			r, c := shape[0], shape[1]
			tr := make([]float32, len(f))
			for i := range r {
				for j := range c {
					tr[j*r+i] = f[i*c+j]
				}
			}
			f, shape = tr, []int{c, r}
		}
		begin := len(data)
		for _, x := range f {
			data = binary.LittleEndian.AppendUint32(data, math.Float32bits(x))
		}
		header[name] = map[string]any{"dtype": "F32", "shape": shape, "data_offsets": []int{begin, len(data)}}
	}
	h, err := json.Marshal(header)
	if err != nil {
		t.Fatal(err)
	}
	for len(h)%8 != 0 {
		h = append(h, ' ')
	}
	out := binary.LittleEndian.AppendUint64(nil, uint64(len(h)))
	out = append(append(out, h...), data...)
	if err := os.WriteFile(path, out, 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestHuggingFaceWeights: a Hugging Face-layout safetensors file
// (model.embed_tokens.weight, model.layers.N.self_attn.q_proj.weight, ...)
// loads into the zoo's Gemma architecture and generates what the same
// weights do in memory; bad files are refused naming the problem.
func TestHuggingFaceWeights(t *testing.T) {
	ctx := watchdog(t, 4*time.Minute)
	be := backend(t)
	store, err := generate.InitStore(be, gemmaHF, 8)
	if err != nil {
		t.Fatal(err)
	}
	w := generate.StoreWeights(store)
	path := filepath.Join(t.TempDir(), "model.safetensors")
	writeHF(t, ctx, path, varsOf(t, ctx, gemmaHF, w), w)
	hf, err := generate.SafetensorsWeights(generate.HFNames, path)
	if err != nil {
		t.Fatal(err)
	}
	if names := hf.Names(); !slices.Contains(names, "model.layers.1.self_attn.q_proj.weight") || !slices.Contains(names, "lm_head.weight") {
		t.Fatalf("tensors %v", names)
	}
	g, err := generate.Open(ctx, be, nvmeConfig(t, 4<<20, false), gemmaHF, hf, generate.Options{Logger: quiet, NoBandwidthProbe: true})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	checkInPlace(t, g, 4, len(g.Vars())-1) // all but lm_head.weight, stored transposed
	ps, s := prompts(2, 5, 97, 6), generate.Sampling{MaxNewTokens: 12}
	res, err := g.Generate(ctx, ps, s, nil)
	if err != nil {
		t.Fatal(err)
	}
	want, err := generate.InMemory(ctx, be, gemmaHF, w, ps, s)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.EqualFunc(res.Tokens, want, slices.Equal) || distinct(want) < 3 {
		t.Fatalf("from the Hugging Face file %v, in memory %v", res.Tokens, want)
	}
	// Bad files: a header length past the file, a truncated tensor.
	raw, _ := os.ReadFile(path)
	bad := filepath.Join(t.TempDir(), "bad.safetensors")
	for _, c := range []struct {
		data []byte
		want string
	}{
		{binary.LittleEndian.AppendUint64(nil, 1<<40), "header length 1099511627776"},
		{raw[:len(raw)-4], "data_offsets"},
		{append(binary.LittleEndian.AppendUint64(nil, 2), "{}"...), "no tensors"},
	} {
		if err := os.WriteFile(bad, c.data, 0o644); err != nil {
			t.Fatal(err)
		}
		if _, err := generate.SafetensorsWeights(generate.HFNames, bad); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v", c.want, err)
		}
	}
}

// checkInPlace: want weights are read where they lie (at whatever offset
// the file packed them), and the swap files hold only the others.
func checkInPlace(t *testing.T, g *generate.Generator, size, want int) {
	t.Helper()
	n, b := g.InPlace()
	var all int64
	for _, v := range g.Vars() {
		all += int64(v.Numel() * size)
	}
	if n != want || b == 0 {
		t.Fatalf("%d of %d weights read in place, want %d", n, len(g.Vars()), want)
	}
	if w := g.Runtime().ParamStore.Stats().BytesWritten; w+b != all {
		t.Fatalf("%d bytes written to the swap files + %d read in place != the weights' %d", w, b, all)
	}
	t.Logf("%d of %d weights (%d of %d bytes) read in place", n, len(g.Vars()), b, all)
}

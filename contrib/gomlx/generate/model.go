package generate

import (
	"errors"
	"fmt"
	"math"
	"sort"
	"strings"

	"github.com/gomlx/compute"
	"github.com/gomlx/compute/dtypes"
	"github.com/gomlx/compute/shapes"
	"github.com/gomlx/gomlx/core/graph"
	"github.com/gomlx/gomlx/ml/layers"
	"github.com/gomlx/gomlx/ml/layers/norm"
	"github.com/gomlx/gomlx/ml/model"
	"github.com/gomlx/gomlx/ml/zoo/transformer"

	"github.com/zinfio/zinf/contrib/gomlx/internal/layerexec"
	"github.com/zinfio/zinf/tensor"
)

// ModelFn builds the zoo transformer on a scope of a Store: the same
// function the model was created or trained with. It sets the
// hyperparameters; the variables are created under the Model's Scope when
// a graph is built. The generator and the in-memory reference both call it
// on Stores of their own, so variable paths agree.
type ModelFn func(root *model.Scope) *transformer.Model

// Var is one weight of the model as zinf holds it: the GoMLX variable path
// (its zinf tensor name), shape and dtype, and its zinf layer (0: the
// token embedding, 1..NumLayers: the transformer layers, NumLayers+1: the
// final normalization and the output head).
type Var struct {
	Name  string
	Shape shapes.Shape
	Layer int
	// rel is the path with the layer's scope replaced, the same for
	// every transformer layer: one swap-in buffer serves them all.
	rel string
}

// Numel returns the variable's number of elements.
func (v Var) Numel() int { return v.Shape.Size() }

// Desc is the variable as a zinf tensor.
func (v Var) Desc() tensor.Desc {
	return tensor.Desc{Name: v.Name, Shape: append([]int(nil), v.Shape.Dimensions...), Layer: v.Layer}
}

// zdtype maps a GoMLX float dtype to zinf's.
func zdtype(d dtypes.DType) (tensor.DType, error) {
	if dt, ok := layerexec.DType(d); ok {
		return dt, nil
	}
	return 0, fmt.Errorf("zinf generate: model dtype %s (allowed: float32, bfloat16, float16)", d)
}

// checkModel refuses the zoo features the layer-by-layer forward does not
// reproduce exactly.
func checkModel(m *transformer.Model) error {
	var errs []error
	if m == nil {
		return errors.New("zinf generate: ModelFn returned a nil Model")
	}
	if m.Scope == nil {
		errs = append(errs, errors.New("zinf generate: the Model has no Scope (build it with transformer.New(scope))"))
	}
	if m.VocabSize <= 0 || m.EmbedDim <= 0 || m.NumLayers <= 0 || m.NumHeads <= 0 || m.HeadDim <= 0 {
		errs = append(errs, fmt.Errorf("zinf generate: model VocabSize %d, EmbedDim %d, NumLayers %d, NumHeads %d, HeadDim %d (allowed: all > 0)",
			m.VocabSize, m.EmbedDim, m.NumLayers, m.NumHeads, m.HeadDim))
	}
	switch m.Architecture {
	case transformer.ArchitectureStandard, transformer.ArchitectureGemma, transformer.ArchitectureGemma3:
	default:
		errs = append(errs, fmt.Errorf("zinf generate: architecture %s (supported: Standard, Gemma, Gemma3)", m.Architecture))
	}
	if m.HiddenSizePerLayerInput > 0 {
		errs = append(errs, errors.New("zinf generate: per-layer embeddings (HiddenSizePerLayerInput > 0) are not supported"))
	}
	if m.NumKVSharedLayers > 0 {
		errs = append(errs, errors.New("zinf generate: KV-shared layers (NumKVSharedLayers > 0) are not supported"))
	}
	for _, n := range []struct{ what, typ string }{{"EmbedNormalization", m.EmbedNormalization}, {"FinalNormalization", m.FinalNormalization}} {
		switch n.typ {
		case "", layers.NormalizationNone, layers.NormalizationLayerNorm, layers.NormalizationRMSNorm, layers.NormalizationDyT:
		default:
			errs = append(errs, fmt.Errorf("zinf generate: %s %q (supported: none, layer, rms, dyt)", n.what, n.typ))
		}
	}
	if _, err := zdtype(m.DType); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// normalize is the zoo's normalization of the embeddings and of the last
// layer's output, op for op (transformer.Model.normalize is unexported).
func normalize(m *transformer.Model, scope *model.Scope, x *graph.Node, typ string) *graph.Node {
	switch typ {
	case "", layers.NormalizationNone:
		return x
	case layers.NormalizationRMSNorm:
		b := norm.RMSNorm(scope, x).WithEpsilon(m.NormEpsilon)
		if m.Architecture == transformer.ArchitectureGemma || m.Architecture == transformer.ArchitectureGemma3 || m.Architecture == transformer.ArchitectureGemma4 {
			if m.RMSNormOffset != 0 {
				b = b.WithScaleOffset(m.RMSNormOffset)
			}
		}
		return b.Done()
	case layers.NormalizationLayerNorm:
		return norm.LayerNorm(scope, x, -1).Epsilon(m.NormEpsilon).Done()
	case layers.NormalizationDyT:
		return norm.DynamicTanh(scope, x).WithAlpha(m.DyTAlpha).Done()
	}
	panic(fmt.Errorf("zinf generate: normalization %q", typ))
}

// embed is the model's input: the token embedding (and normalization).
func embed(m *transformer.Model, tokens *graph.Node) *graph.Node {
	x := m.EmbedTokens(tokens)
	if m.EmbedNormalization != layers.NormalizationNone && m.EmbedNormalization != "" {
		x = normalize(m, m.Scope.In("embed_norm"), x, m.EmbedNormalization)
	}
	return x
}

// head is the model's output: final normalization, the logits of the last
// position (as GoMLX's generator slices them) and the next token.
func head(m *transformer.Model, x *graph.Node) *graph.Node {
	if m.FinalNormalization != layers.NormalizationNone && m.FinalNormalization != "" {
		x = normalize(m, m.Scope.In("final_norm"), x, m.FinalNormalization)
	}
	logits := m.LogitsFromEmbeddings(x)
	if logits.Shape().Dimensions[1] > 1 {
		logits = graph.Slice(logits, graph.AxisRange(), graph.AxisElem(-1), graph.AxisRange())
	}
	return graph.Squeeze(logits, 1)
}

// discover builds the whole model once (uncompiled inputs of shape
// [1, 1]) on store to create its variables, and sorts them into zinf
// layers. It refuses a model with a positional pre-encoder (absolute
// position embeddings added before the first layer), which the
// layer-by-layer forward does not apply.
func discover(backend compute.Backend, store *model.Store, m *transformer.Model) (vars []Var, err error) {
	preEncoded := false
	e, err := model.NewExec(backend, store, func(scope *model.Scope, tokens *graph.Node) *graph.Node {
		m.Scope = m.Scope.ResetVisited()
		x := m.EmbedTokens(tokens)
		if m.PrePositionalEncoder(x, 0, true) != x {
			preEncoded = true
		}
		m.Scope = m.Scope.ResetVisited()
		return m.Logits(tokens, transformer.CallOptions{})
	})
	if err != nil {
		return nil, fmt.Errorf("zinf generate: building the model: %w", err)
	}
	defer e.Finalize()
	if err := catch(func() error {
		_, err := e.Compile(shapes.Make(dtypes.Int32, 1, 1))
		return err
	}); err != nil {
		return nil, fmt.Errorf("zinf generate: building the model: %w", err)
	}
	if preEncoded {
		return nil, errors.New("zinf generate: the model's positional encoder adds position embeddings before the first layer (a pos.PreEncoder), which generation through zinf does not apply; use RoPE (WithRoPE)")
	}
	root := strings.TrimSuffix(m.Scope.Scope(), "/") // "" for a model at the Store's root scope
	last := m.NumLayers + 1
	for v := range store.IterVariables() {
		if v.Name() == model.RNGStateVariableName {
			continue
		}
		p := v.Path()
		vr := Var{Name: p, Shape: v.Shape(), Layer: -1, rel: p}
		rest, ok := strings.CutPrefix(p, root+"/")
		if !ok {
			return nil, fmt.Errorf("zinf generate: variable %q is outside the model's scope %q", p, m.Scope.Scope())
		}
		first, tail, _ := strings.Cut(rest, "/")
		switch {
		case strings.HasPrefix(first, "layer_"):
			var n int
			if _, err := fmt.Sscanf(first, "layer_%d", &n); err != nil || fmt.Sprintf("layer_%d", n) != first || n < 0 || n >= m.NumLayers {
				return nil, fmt.Errorf("zinf generate: variable %q: %q is not a layer of a %d-layer model", p, first, m.NumLayers)
			}
			vr.Layer, vr.rel = n+1, "layer/"+tail
		case first == "token_embed" || first == "token_type_embed" || first == "embed_norm":
			vr.Layer = 0
		case first == "final_norm" || first == "output":
			vr.Layer = last
		default:
			return nil, fmt.Errorf("zinf generate: variable %q: scope %q is none of the zoo transformer's (token_embed, layer_N, final_norm, output)", p, first)
		}
		if !v.DType().IsFloat() {
			return nil, fmt.Errorf("zinf generate: variable %q has dtype %s (only float weights are streamed)", p, v.DType())
		}
		vars = append(vars, vr)
	}
	sort.SliceStable(vars, func(i, j int) bool {
		if vars[i].Layer != vars[j].Layer {
			return vars[i].Layer < vars[j].Layer
		}
		return vars[i].Name < vars[j].Name
	})
	return vars, nil
}

// catch runs fn, turning a panic (GoMLX reports graph-building errors so)
// into an error (see layerexec.Catch).
func catch(fn func() error) error { return layerexec.Catch(fn) }

// toFloat32 widens a tensor's bytes of dtype d into dst.
func toFloat32(d dtypes.DType, src []byte, dst []float32) error {
	switch d {
	case dtypes.Float32:
		if len(src) != 4*len(dst) {
			return fmt.Errorf("%d bytes for %d float32 values", len(src), len(dst))
		}
		for i := range dst {
			dst[i] = math.Float32frombits(uint32(src[4*i]) | uint32(src[4*i+1])<<8 | uint32(src[4*i+2])<<16 | uint32(src[4*i+3])<<24)
		}
	case dtypes.BFloat16:
		if len(src) != 2*len(dst) {
			return fmt.Errorf("%d bytes for %d bfloat16 values", len(src), len(dst))
		}
		for i := range dst {
			dst[i] = math.Float32frombits((uint32(src[2*i]) | uint32(src[2*i+1])<<8) << 16)
		}
	default:
		return fmt.Errorf("dtype %s (allowed: float32, bfloat16)", d)
	}
	return nil
}

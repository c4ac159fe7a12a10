// Package nativecheck describes GoMLX's zoo transformer to zinf's native
// decoder (github.com/zinfio/zinf/decoder) and reads a Store's weights as
// the decoder's byte views: what the tests that hold the native decoder to
// GoMLX's in-memory generation need, and what the generator will use to
// pick the native decoder for a zoo model.
package nativecheck

import (
	"errors"
	"fmt"
	"reflect"
	"strings"

	"github.com/gomlx/compute/dtypes"
	"github.com/gomlx/gomlx/ml/layers"
	"github.com/gomlx/gomlx/ml/layers/activation"
	"github.com/gomlx/gomlx/ml/layers/attention/pos"
	"github.com/gomlx/gomlx/ml/model"
	"github.com/gomlx/gomlx/ml/zoo/transformer"

	"github.com/zinfio/zinf/decoder"
	"github.com/zinfio/zinf/decoder/kernels"
)

// ZooConfig returns the native decoder's description of the zoo model m,
// or an error naming each zoo feature the decoder does not cover.
func ZooConfig(m *transformer.Model) (decoder.Config, error) {
	var errs []error
	no := func(format string, a ...any) {
		errs = append(errs, fmt.Errorf("nativecheck: the native decoder does not cover "+format, a...))
	}
	if m == nil {
		return decoder.Config{}, errors.New("nativecheck: nil zoo model")
	}
	c := decoder.Config{
		Vocab: m.VocabSize, Dim: m.EmbedDim, Layers: m.NumLayers, Heads: m.NumHeads, KVHeads: m.NumKVHeads,
		HeadDim: m.HeadDim, FFNDim: m.FFNDim, NormEps: m.NormEpsilon, EmbedScale: m.ScaleTokenEmbeddings,
		QKVBias: m.UseBias, OutBias: m.UseBias, FFNBias: m.UseBias, HeadLayout: decoder.InOut,
	}
	if c.FFNDim == 0 {
		c.FFNDim = 4 * c.Dim // the zoo's default
	}
	if m.TransposedProjections {
		c.Layout = decoder.OutIn
	} else {
		c.Layout = decoder.InOut
	}
	norm := func(what, n string) decoder.Norm {
		switch n {
		case "", layers.NormalizationNone:
			return decoder.NoNorm
		case layers.NormalizationRMSNorm:
			return decoder.RMSNorm
		case layers.NormalizationLayerNorm:
			return decoder.LayerNorm
		}
		no("%s %q (covered: none, rms, layer)", what, n)
		return decoder.NoNorm
	}
	c.Norm = norm("Normalization", m.Normalization)
	c.EmbedNorm = norm("EmbedNormalization", m.EmbedNormalization)
	c.FinalNorm = norm("FinalNormalization", m.FinalNormalization)
	switch m.Architecture {
	case transformer.ArchitectureStandard:
		c.Block = decoder.PostNorm
		switch m.Activation {
		case activation.TypeSwiGLU:
			c.Activation, c.Gated, c.FusedGateUp = decoder.SiLU, true, true
		default:
			c.Activation = zooActivation(m.Activation, no)
		}
	case transformer.ArchitectureGemma:
		c.Block, c.Gated = decoder.Sandwich, true
		c.Activation = zooActivation(m.Activation, no)
		// The zoo adds the offset to every RMSNorm scale of a Gemma model,
		// the embedding and final norms included, as the decoder does.
		c.NormScaleOffset = m.RMSNormOffset
	default:
		no("architecture %s (covered: Standard, Gemma)", m.Architecture)
	}
	if m.Dropout != 0 {
		no("dropout %v at inference (want 0)", m.Dropout)
	}
	if !m.UseCausalMask {
		no("attention without the causal mask")
	}
	if m.TokenTypeEmbedSize > 0 {
		no("token type embeddings")
	}
	if len(m.LayerTypes) > 0 || m.SlidingWindow > 0 {
		no("layer types or sliding windows")
	}
	if m.GlobalHeadDim > 0 {
		no("GlobalHeadDim %d", m.GlobalHeadDim)
	}
	if m.NumKVSharedLayers > 0 || m.HiddenSizePerLayerInput > 0 {
		no("KV-shared layers or per-layer embeddings")
	}
	if m.AttentionScoreSoftCap != 0 || m.FinalLogitSoftCap != 0 {
		no("soft caps (attention %v, logits %v)", m.AttentionScoreSoftCap, m.FinalLogitSoftCap)
	}
	if m.QueryKeyScale != 0 {
		no("QueryKeyScale %v (the decoder scales by 1/sqrt(HeadDim))", m.QueryKeyScale)
	}
	switch m.DType {
	case dtypes.Float32, dtypes.BFloat16:
	default:
		no("dtype %s (covered: float32, bfloat16)", m.DType)
	}
	if err := zooRoPE(m, &c); err != nil {
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		return decoder.Config{}, err
	}
	return c, c.Validate()
}

func zooActivation(a activation.Type, no func(string, ...any)) decoder.Activation {
	switch a {
	case activation.TypeSilu, activation.TypeSwish:
		return decoder.SiLU
	case activation.TypeGelu:
		return decoder.GELU
	case activation.TypeGeluApprox:
		return decoder.GELUTanh
	case activation.TypeRelu:
		return decoder.ReLU
	}
	no("activation %s (covered: silu, gelu, gelu_approximate, relu, swiglu)", a)
	return 0
}

// zooRoPE reads the model's positional encoder, an unexported field the
// zoo offers no getter for, by reflection (reading only): the decoder
// covers a pos.RoPE on a prefix of each head, or no encoder.
func zooRoPE(m *transformer.Model, c *decoder.Config) error {
	mv := reflect.ValueOf(m).Elem()
	if f := mv.FieldByName("layerPosEncoders"); f.IsValid() && f.Len() > 0 {
		return errors.New("nativecheck: the native decoder does not cover per-layer positional encoders")
	}
	f := mv.FieldByName("posEncoder")
	if !f.IsValid() {
		return errors.New("nativecheck: this GoMLX's zoo Model has no posEncoder field to read the RoPE settings from")
	}
	if f.IsNil() {
		return errors.New("nativecheck: the native decoder does not cover a zoo model without RoPE (WithRoPE)")
	}
	e := f.Elem()
	if e.Type() != reflect.TypeOf(&pos.RoPE{}) {
		return fmt.Errorf("nativecheck: the native decoder does not cover positional encoder %s (covered: pos.RoPE)", e.Type())
	}
	r := e.Elem()
	get := func(name string) reflect.Value { return r.FieldByName(name) }
	if v := get("FrequencyDivisor"); v.Int() != 0 {
		return fmt.Errorf("nativecheck: the native decoder does not cover RoPE FrequencyDivisor %d", v.Int())
	}
	if v := get("LinearScalingFactor").Float(); v != 0 && v != 1 {
		return fmt.Errorf("nativecheck: the native decoder does not cover RoPE linear scaling %v", v)
	}
	start, end := int(get("DimStart").Int()), int(get("DimEnd").Int())
	if start != 0 {
		return fmt.Errorf("nativecheck: the native decoder does not cover RoPE from dimension %d (covered: from 0)", start)
	}
	c.RoPEBase = get("BaseFreq").Float()
	c.RoPEInterleaved = get("Interleaved").Bool()
	if end != -1 && end != m.HeadDim {
		c.RoPEDims = end
	}
	return nil
}

// StoreWeights reads the weights of the zoo model described by c, at
// scope (the model's scope path, e.g. "/transformer"), from store as the
// decoder's views: copies of each variable's bytes (the Store's buffers
// are not views the decoder may keep; zinf's pinned buffers are).
func StoreWeights(store *model.Store, c decoder.Config, scope string) (decoder.ModelWeights, []decoder.LayerWeights, error) {
	var mw decoder.ModelWeights
	lw := make([]decoder.LayerWeights, c.Layers)
	names, err := c.Names(decoder.ZooNames, strings.TrimSuffix(scope, "/"))
	if err != nil {
		return mw, nil, err
	}
	for _, n := range names {
		v := store.GetVariable(n.Name)
		if v == nil {
			return mw, nil, fmt.Errorf("nativecheck: the Store has no variable %q (weight role %d of layer %d)", n.Name, n.Role, n.Layer)
		}
		t, err := v.Value()
		if err != nil {
			return mw, nil, err
		}
		var typ kernels.DType
		switch t.DType() {
		case dtypes.Float32:
			typ = kernels.F32
		case dtypes.BFloat16:
			typ = kernels.BF16
		default:
			return mw, nil, fmt.Errorf("nativecheck: variable %q has dtype %s (allowed: float32, bfloat16)", n.Name, t.DType())
		}
		var data []byte
		if err := t.ConstBytes(func(b []byte) { data = append([]byte(nil), b...) }); err != nil {
			return mw, nil, err
		}
		tt := decoder.Tensor{Type: typ, Data: data}
		if n.Layer >= 0 {
			lw[n.Layer][n.Role] = tt
		} else if err := mw.Set(n.Role, tt); err != nil {
			return mw, nil, err
		}
	}
	return mw, lw, nil
}

package zgomlx

import (
	"errors"
	"fmt"

	"github.com/gomlx/compute/dtypes"
	. "github.com/gomlx/gomlx/core/graph" //nolint:revive // graph-building code reads as math
	"github.com/gomlx/gomlx/ml/layers"
	"github.com/gomlx/gomlx/ml/layers/norm"
	"github.com/gomlx/gomlx/ml/model"
	"github.com/gomlx/gomlx/ml/nn"
	"github.com/gomlx/gomlx/ml/train/loss"
	"github.com/gomlx/gomlx/ml/zoo/transformer"
)

// TransformerOptions configure TransformerNet.
type TransformerOptions struct {
	// TieEmbeddings makes the output head read the token embedding table
	// (logits = x · Eᵀ) instead of its own "output" weights: one zinf
	// tensor used by the first and the last layer (Layer.Borrow). The
	// zoo has no such option; the whole-graph reference of a tied model is
	// the same Net in one graph (reference.WholeGraph).
	TieEmbeddings bool
	// HeadBlockRows, with TieEmbeddings, computes the tied head in blocks
	// of that many rows of the table (Net.Head, BlockedHead): the Trainer
	// never holds the vocab x d table whole in Go memory (the embedding
	// reads its rows, the head its blocks). Its reference is the head
	// written blockwise in one graph (reference.WholeGraph of the Net), not the
	// one product over the whole table. 0: one product (Layer.Borrow).
	HeadBlockRows int
}

// TransformerNet is GoMLX's zoo transformer (ml/zoo/transformer) as a
// Net of the zoo's own exported pieces, one zinf layer each: the token
// embedding (Model.EmbedTokens, Model.PrePositionalEncoder and the
// embedding normalization; its table is a Layer.Lookups, so a table
// larger than zinf's piece is read at the batch's rows only), every block (Model.ForwardLayer, residuals
// and all), and the head (the final normalization and
// Model.LogitsFromEmbeddings). Its variables are the ones Model.Logits
// creates, at the same paths under m.Scope, created in the same order, so
// Create gives them the values GoMLX gives the model in memory. The
// first layer takes the tokens [batch, seq] (int32); the loss is
// TransformerLoss of the logits and the next tokens [batch, seq].
//
// Two pieces are not exported by the zoo and are rebuilt here from the
// same public calls: the embedding and final normalizations
// (Model.normalize: norm.LayerNorm, norm.RMSNorm, norm.DynamicTanh with
// the Model's epsilon, offset and alpha), and the position argument of
// ForwardLayer (Model.AllLayers passes element [0,0] of its sequential
// positions: the constant 0, passed here as such). Refused, with the
// field named: dropout (the per-layer backward recomputes each layer and
// would draw other masks), KV-shared layers and per-layer inputs (Gemma
// 4: tensors between non-adjacent layers), a token-type embedding, a
// KV cache and attention masks (CallOptions are for generation).
func TransformerNet(m *transformer.Model, opts TransformerOptions) (Net, error) {
	if m == nil || m.Scope == nil {
		return Net{}, errors.New("zgomlx: TransformerNet needs a transformer.Model with a Scope (transformer.New(store.RootScope()))")
	}
	var errs []error
	refuse := func(bad bool, field string, v any, allowed string) {
		if bad {
			errs = append(errs, fmt.Errorf("zgomlx: transformer.Model.%s %v (allowed: %s)", field, v, allowed))
		}
	}
	refuse(m.VocabSize <= 0, "VocabSize", m.VocabSize, "> 0")
	refuse(m.EmbedDim <= 0, "EmbedDim", m.EmbedDim, "> 0")
	refuse(m.NumLayers <= 0, "NumLayers", m.NumLayers, "> 0")
	refuse(m.NumHeads <= 0, "NumHeads", m.NumHeads, "> 0")
	refuse(m.HeadDim <= 0, "HeadDim", m.HeadDim, "> 0")
	refuse(m.Dropout != 0, "Dropout", m.Dropout, "0: dropout draws its masks from the Store's random state inside the graph, and the per-layer backward recomputes each layer, so it would draw other masks than the forward did")
	refuse(m.NumKVSharedLayers != 0, "NumKVSharedLayers", m.NumKVSharedLayers, "0")
	refuse(m.HiddenSizePerLayerInput != 0, "HiddenSizePerLayerInput", m.HiddenSizePerLayerInput, "0")
	refuse(m.TokenTypeEmbedSize != 0, "TokenTypeEmbedSize", m.TokenTypeEmbedSize, "0")
	if opts.HeadBlockRows != 0 {
		refuse(opts.HeadBlockRows < 0, "(TransformerOptions.HeadBlockRows)", opts.HeadBlockRows, "0, or > 0 rows a block")
		refuse(!opts.TieEmbeddings, "(TransformerOptions.TieEmbeddings)", opts.TieEmbeddings, "true with HeadBlockRows: the zoo's untied head stores its weights [d, vocab], whose blocks of the vocabulary are columns, not rows zinf reads in blocks")
		refuse(m.FinalLogitSoftCap > 0, "FinalLogitSoftCap", m.FinalLogitSoftCap, "0 with HeadBlockRows")
	}
	if len(errs) > 0 {
		return Net{}, errors.Join(errs...)
	}
	base := m.Scope.Scope()
	at := func(name string) string { return model.JoinPath(base, name) }
	// zoo returns a copy of m over the Store a graph is built in, with a
	// fresh scope (sub-scopes not yet visited): one per graph.
	zoo := func(scope *model.Scope) *transformer.Model {
		c := *m
		c.Scope = scope.Store().Scope(base)
		return &c
	}
	var net Net
	embed := Layer{Scope: at("token_embed"), FnN: func(scope *model.Scope, xs []*Node) []*Node {
		z := zoo(scope)
		tokens := xs[0]
		if tokens.Rank() == 1 {
			tokens = ExpandAxes(tokens, 0)
		}
		x := z.EmbedTokens(tokens)
		x = z.PrePositionalEncoder(x, 0, false)
		if z.EmbedNormalization != layers.NormalizationNone {
			x = zooNormalize(z, z.Scope.In("embed_norm"), x, z.EmbedNormalization)
		}
		return []*Node{x}
	}}
	if m.EmbedNormalization != layers.NormalizationNone {
		embed.Also = []string{at("embed_norm")}
	}
	// EmbedTokens Gathers the table at the tokens (layers.Embedding): a
	// table zinf streams is read, and its gradient handed over, at the
	// batch's rows only.
	embed.Lookups = []Lookup{{Var: at("token_embed/embeddings"), Input: 0}}
	net.Layers = append(net.Layers, embed)
	for i := range m.NumLayers {
		net.Layers = append(net.Layers, Layer{Scope: at(fmt.Sprintf("layer_%d", i)), FnN: func(scope *model.Scope, xs []*Node) []*Node {
			z := zoo(scope)
			x := xs[0]
			position := ScalarZero(x.Graph(), dtypes.Int32)
			return []*Node{z.ForwardLayer(scope, i, x, position, nil, nil, nil, transformer.CallOptions{})}
		}})
	}
	head := Layer{Scope: at("output"), FnN: func(scope *model.Scope, xs []*Node) []*Node {
		z := zoo(scope)
		x := xs[0]
		if z.FinalNormalization != layers.NormalizationNone {
			x = zooNormalize(z, z.Scope.In("final_norm"), x, z.FinalNormalization)
		}
		if !opts.TieEmbeddings {
			return []*Node{z.LogitsFromEmbeddings(x)}
		}
		if opts.HeadBlockRows > 0 {
			return []*Node{x} // Net.Head computes the logits in blocks
		}
		table := z.Scope.Store().GetVariable(at("token_embed/embeddings"))
		if table == nil {
			panic(fmt.Errorf("zgomlx: tied head: no variable %q (the embedding layer makes it)", at("token_embed/embeddings")))
		}
		logits := Einsum("bsd,vd->bsv", x, table.NodeValue(x.Graph()))
		if z.FinalLogitSoftCap > 0 {
			logits = nn.SoftCap(logits, z.FinalLogitSoftCap)
		}
		return []*Node{logits}
	}}
	if m.FinalNormalization != layers.NormalizationNone {
		head.Also = []string{at("final_norm")}
	}
	switch {
	case opts.TieEmbeddings && opts.HeadBlockRows > 0:
		net.Head = &BlockedHead{Table: at("token_embed/embeddings"), Rows: opts.HeadBlockRows}
	case opts.TieEmbeddings:
		head.Borrow = []string{at("token_embed/embeddings")}
	}
	net.Layers = append(net.Layers, head)
	net.TrainLoss = TransformerLoss
	return net, nil
}

// TransformerLoss is the language-model loss of TransformerNet: the mean
// cross-entropy (loss.SparseCategoricalCrossEntropyLogits, in float32) of
// the logits [batch, seq, vocab] and the next tokens [batch, seq] (or
// [batch, seq, 1]).
func TransformerLoss(labels, predictions []*Node) *Node {
	logits := ConvertDType(predictions[0], dtypes.Float32)
	l := labels[0]
	if l.Rank() == logits.Rank()-1 {
		l = ExpandAxes(l, -1)
	}
	return ReduceAllMean(loss.SparseCategoricalCrossEntropyLogits([]*Node{l}, []*Node{logits}))
}

// zooNormalize is the zoo's unexported Model.normalize, from the same
// public calls.
func zooNormalize(m *transformer.Model, scope *model.Scope, x *Node, kind string) *Node {
	switch kind {
	case layers.NormalizationNone:
		return x
	case layers.NormalizationRMSNorm:
		b := norm.RMSNorm(scope, x).WithEpsilon(m.NormEpsilon)
		if m.Architecture != transformer.ArchitectureStandard && m.RMSNormOffset != 0 {
			b = b.WithScaleOffset(m.RMSNormOffset)
		}
		return b.Done()
	case layers.NormalizationLayerNorm:
		return norm.LayerNorm(scope, x, -1).Epsilon(m.NormEpsilon).Done()
	case layers.NormalizationDyT:
		return norm.DynamicTanh(scope, x).WithAlpha(m.DyTAlpha).Done()
	}
	panic(fmt.Errorf("zgomlx: transformer normalization %q (allowed: %q, %q, %q, %q)", kind, layers.NormalizationNone, layers.NormalizationRMSNorm, layers.NormalizationLayerNorm, layers.NormalizationDyT))
}

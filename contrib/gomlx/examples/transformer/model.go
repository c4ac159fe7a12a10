package main

import (
	"fmt"

	"github.com/gomlx/compute/dtypes"
	"github.com/gomlx/compute/shapes"
	. "github.com/gomlx/gomlx/core/graph" //nolint:revive // graph-building code reads as math
	"github.com/gomlx/gomlx/core/tensors"
	"github.com/gomlx/gomlx/ml/layers"
	"github.com/gomlx/gomlx/ml/layers/attention"
	"github.com/gomlx/gomlx/ml/layers/norm"
	"github.com/gomlx/gomlx/ml/model"

	zgomlx "github.com/zinfio/zinf/contrib/gomlx"
)

// shape is the transformer's size.
type shape struct {
	vocab, seq, dim, heads, blocks, batch int
	dtype                                 dtypes.DType
}

// net is a small causal transformer language model, one zinf layer per
// block: a token and a learned position embedding; pre-norm blocks of
// multi-head causal self-attention and a tanh MLP, each with a residual;
// a final layer norm and the unembedding. The loss is the mean
// cross-entropy of the next token.
func net(s shape) zgomlx.Net {
	n := zgomlx.Net{}
	n.Layers = append(n.Layers, zgomlx.Layer{Scope: "/embed", Fn: func(scope *model.Scope, tokens *Node) *Node {
		x := layers.Embedding(scope.In("tokens"), tokens, s.dtype, s.vocab, s.dim)
		pos := scope.VariableWithShape("positions", shapes.Make(s.dtype, s.seq, s.dim)).NodeValue(tokens.Graph())
		return Add(x, ExpandAxes(MulScalar(pos, 0.02), 0))
	}})
	for b := range s.blocks {
		n.Layers = append(n.Layers, zgomlx.Layer{Scope: fmt.Sprintf("/block_%d", b), Fn: func(scope *model.Scope, x *Node) *Node {
			h := norm.LayerNorm(scope.In("ln1"), x, -1).Done()
			x = Add(x, attention.SelfAttention(scope.In("attn"), h, s.heads, s.dim/s.heads).WithCausalMask(true).Done())
			h = norm.LayerNorm(scope.In("ln2"), x, -1).Done()
			h = Tanh(layers.Dense(scope.In("fc1"), h, true, 4*s.dim))
			return Add(x, layers.Dense(scope.In("fc2"), h, true, s.dim))
		}})
	}
	n.Layers = append(n.Layers, zgomlx.Layer{Scope: "/head", Fn: func(scope *model.Scope, x *Node) *Node {
		return layers.Dense(scope.In("out"), norm.LayerNorm(scope.In("ln"), x, -1).Done(), false, s.vocab)
	}})
	n.Loss = func(logits, labels *Node) *Node {
		logp := LogSoftmax(ConvertDType(logits, dtypes.Float32), -1)
		return Neg(ReduceAllMean(ReduceSum(Mul(logp, OneHot(labels, s.vocab, dtypes.Float32)), -1)))
	}
	return n
}

// batch is step's batch of the synthetic task: each sequence is an
// arithmetic progression modulo the vocabulary with a per-sequence start
// and stride; the label is the next token. A model has to read the
// context (two tokens give the stride) to predict it.
func batch(s shape, step int) (x, y *tensors.Tensor) {
	xs := make([]int32, s.batch*s.seq)
	ys := make([]int32, s.batch*s.seq)
	for b := range s.batch {
		k := step*s.batch + b
		start, stride := (k*7919)%s.vocab, 1+(k*104729)%7
		for i := range s.seq {
			xs[b*s.seq+i] = int32((start + i*stride) % s.vocab)
			ys[b*s.seq+i] = int32((start + (i+1)*stride) % s.vocab)
		}
	}
	return tensors.FromFlatDataAndDimensions(xs, s.batch, s.seq), tensors.FromFlatDataAndDimensions(ys, s.batch, s.seq)
}

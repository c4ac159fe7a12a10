package reference

import (
	"fmt"

	"github.com/gomlx/compute/dtypes"
	"github.com/gomlx/compute/shapes"
	. "github.com/gomlx/gomlx/core/graph" //nolint:revive // graph-building code reads as math
	"github.com/gomlx/gomlx/core/tensors"
	"github.com/gomlx/gomlx/ml/model"
	gopt "github.com/gomlx/gomlx/ml/train/optimizer"

	"github.com/zinfio/zinf/buffers"
	"github.com/zinfio/zinf/contrib/gomlx/internal/layerexec"
	"github.com/zinfio/zinf/swapper"
	zopt "github.com/zinfio/zinf/swapper/optimizer"
)

// AdamScope is where Adam keeps its state variables, under GoMLX's
// optimizer scope: "/optimizers/zinf_adam/<variable path with / as _>/"
// holds exp_avg, exp_avg_sq and, for a variable that is not float32, its
// float32 master.
const AdamScope = "zinf_adam"

// AdamOptimizer is zinf's Adam as a GoMLX optimizer (train/optimizer's
// Interface): the formula and the order of float32 operations of
// swapper/optimizer.Adam (torch.optim.Adam's), each operation rounded on
// its own, the bias corrections from float64 powers rounded once, and for
// bfloat16/float16 variables a float32 master rounded to the variable's
// dtype after each step (to nearest even, as zinf encodes). A whole-graph
// GoMLX trainer using it matches zinf's offloaded training bit for bit,
// where GoMLX's own Adam differs in its rounding and its default epsilon
// (1e-7). It needs the variables' dtype to be zinf's param dtype.
type AdamOptimizer struct {
	// Hyper are the hyperparameters (zero fields take zinf's defaults);
	// plan.Hyper(cfg) reads them from a config.
	Hyper zopt.Hyper
}

var _ gopt.Interface = (*AdamOptimizer)(nil)

// Adam returns zinf's Adam with hyperparameters h as a GoMLX optimizer.
func Adam(h zopt.Hyper) *AdamOptimizer { return &AdamOptimizer{Hyper: h} }

// UpdateGraph builds one step for every trainable variable the loss
// depends on. It implements optimizer.Interface.
func (a *AdamOptimizer) UpdateGraph(scope *model.Scope, g *Graph, loss *Node) {
	h := a.Hyper
	h.EnsureDefaults()
	if err := h.Validate(); err != nil {
		panic(err)
	}
	if h.Rule != zopt.RuleAdam {
		panic(fmt.Errorf("zgomlx: Adam: Hyper.Rule %v (allowed: RuleAdam; AdamW is Hyper.AdamW)", h.Rule))
	}
	var vars []*model.Variable
	for v := range scope.IterVariables() {
		if v.Trainable && v.InUseByGraph(g) {
			vars = append(vars, v)
		}
	}
	grads := scope.BuildTrainableVariablesGradientsGraph(loss) // same variables, same order
	store := scope.Store()
	f32 := dtypes.Float32
	step := gopt.IncrementGlobalStep(g, dtypes.Float64)
	one := Scalar(g, f32, float32(1))
	pow := func(b float32) *Node { return ConvertDType(Pow(Scalar(g, dtypes.Float64, float64(b)), step), f32) }
	bc1 := Sub(one, pow(h.Beta1))              // 1 - float32(beta1^t)
	bc2sqrt := Sqrt(Sub(one, pow(h.Beta2)))    // sqrt32(1 - float32(beta2^t))
	stepSize := Div(Scalar(g, f32, h.LR), bc1) // lr / bc1
	b1, b2 := Scalar(g, f32, h.Beta1), Scalar(g, f32, h.Beta2)
	c1, c2 := Scalar(g, f32, 1-h.Beta1), Scalar(g, f32, 1-h.Beta2)
	eps := Scalar(g, f32, h.Eps)
	for i, v := range vars {
		if !v.DType().IsFloat() {
			continue
		}
		base := model.JoinPath("/", gopt.Scope, AdamScope, model.EscapeScopeName(v.Path()))
		stateShape := shapes.Make(f32, v.Shape().Dimensions...)
		mVar := store.VariableWithShape(base+"/exp_avg", stateShape, Zeros).SetTrainable(false)
		vVar := store.VariableWithShape(base+"/exp_avg_sq", stateShape, Zeros).SetTrainable(false)
		var master *model.Variable
		var p *Node
		if v.DType() == f32 {
			p = v.NodeValue(g)
		} else {
			master = masterVariable(store, base+"/master", v)
			p = master.NodeValue(g)
		}
		gr := grads[i]
		if gr.DType() != f32 {
			gr = ConvertDType(gr, f32)
		}
		if h.WeightDecay != 0 {
			if h.AdamW {
				p = Mul(p, Scalar(g, f32, 1-float32(h.LR*h.WeightDecay))) // decoupled
			} else {
				gr = Add(gr, Mul(Scalar(g, f32, h.WeightDecay), p)) // L2
			}
		}
		m := Add(Mul(b1, mVar.NodeValue(g)), Mul(c1, gr))
		sq := Add(Mul(b2, vVar.NodeValue(g)), Mul(Mul(c2, gr), gr))
		denom := Add(Div(Sqrt(sq), bc2sqrt), eps)
		p = Sub(p, Mul(stepSize, Div(m, denom)))
		mVar.SetNodeValue(m)
		vVar.SetNodeValue(sq)
		if master != nil {
			master.SetNodeValue(p)
			v.SetNodeValue(ConvertDType(p, v.DType()))
		} else {
			v.SetNodeValue(p)
		}
	}
}

// masterVariable returns the float32 master of v, created from v's value
// (exactly widened) the first time.
func masterVariable(store *model.Store, path string, v *model.Variable) *model.Variable {
	if mv := store.GetVariable(path); mv != nil {
		return mv
	}
	val, err := v.Value()
	if err != nil {
		panic(err)
	}
	dt, ok := layerexec.DType(v.DType())
	if !ok {
		panic("zgomlx: Adam: variable " + v.Path() + " has dtype " + v.DType().String())
	}
	t := tensors.FromShape(shapes.Make(dtypes.Float32, v.Shape().Dimensions...))
	err = val.ConstBytes(func(src []byte) {
		err = t.MutableBytes(func(dst []byte) {
			buffers.Transcode(dt, src, swapper.Float32, dst)
		})
	})
	if err != nil {
		panic(err)
	}
	mv, err := store.CreateVariable(path, t)
	if err != nil {
		panic(err)
	}
	return mv.SetTrainable(false)
}

// Clear deletes Adam's state variables. It implements
// optimizer.Interface.
func (a *AdamOptimizer) Clear(scope *model.Scope) error {
	return scope.Store().DeleteVariablesInScope(model.JoinPath("/", gopt.Scope, AdamScope))
}

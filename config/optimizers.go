package config

import (
	"fmt"
	"slices"
	"strings"
)

var (
	adamTypes    = []OptimizerType{OptimizerAdam, OptimizerAdamW}
	allOptimizer = []OptimizerType{OptimizerAdam, OptimizerAdamW, OptimizerSGD, OptimizerAdagrad, OptimizerLion}
	betaTypes    = []OptimizerType{OptimizerAdam, OptimizerAdamW, OptimizerLion}
	epsTypes     = []OptimizerType{OptimizerAdam, OptimizerAdamW, OptimizerAdagrad}
	sgdOnly      = []OptimizerType{OptimizerSGD}
	adagradOnly  = []OptimizerType{OptimizerAdagrad}
	maximizing   = []OptimizerType{OptimizerSGD, OptimizerAdagrad}
	amsgradTypes = []OptimizerType{OptimizerAdam, OptimizerAdamW, OptimizerAdagrad}
)

// optimizerParam is one key of optimizer.params: its reader (nil: accepted
// and ignored) and the types it belongs to.
type optimizerParam struct {
	name  string
	read  func(c *Config) reader
	types []OptimizerType
}

var optimizerParams = []optimizerParam{
	{"lr", func(c *Config) reader { return autoable("(1e-3; Adagrad 1e-2; Lion 1e-4)", floatInto(&c.Optimizer.LR)) }, allOptimizer},
	{"betas", func(c *Config) reader {
		return autoable("([0.9, 0.999]; Lion [0.9, 0.99])", betasInto(&c.Optimizer.Betas))
	}, betaTypes},
	{"eps", func(c *Config) reader { return autoable("(1e-8; Adagrad 1e-10)", floatInto(&c.Optimizer.Eps)) }, epsTypes},
	{"weight_decay", func(c *Config) reader { return autoable("0", floatInto(&c.Optimizer.WeightDecay)) }, allOptimizer},
	{"adam_w_mode", func(c *Config) reader { return boolInto(&c.Optimizer.AdamWMode) }, adamTypes},
	{"amsgrad", func(*Config) reader { return mustBool(false, "is not supported by zinf") }, amsgradTypes},
	{"bias_correction", func(*Config) reader { return mustBool(true, "is not supported by zinf (it always corrects bias)") }, adamTypes},
	{"momentum", func(c *Config) reader { return floatInto(&c.Optimizer.Momentum) }, sgdOnly},
	{"dampening", func(c *Config) reader { return floatInto(&c.Optimizer.Dampening) }, sgdOnly},
	{"nesterov", func(c *Config) reader { return boolInto(&c.Optimizer.Nesterov) }, sgdOnly},
	{"lr_decay", func(c *Config) reader { return floatInto(&c.Optimizer.LRDecay) }, adagradOnly},
	{"initial_accumulator_value", func(c *Config) reader { return floatInto(&c.Optimizer.InitialAccumulatorValue) }, adagradOnly},
	{"maximize", func(*Config) reader { return mustBool(false, "is not supported by zinf") }, maximizing},
	// Implementation switches with no effect on the result.
	{"torch_adam", nil, adamTypes},
	{"fused", nil, adamTypes},
	{"foreach", nil, maximizing},
	{"differentiable", nil, maximizing},
}

// optimizerTypes are the values of optimizer.type zinf accepts.
var optimizerTypes = []string{string(OptimizerAdam), string(OptimizerAdamW), string(OptimizerSGD), string(OptimizerAdagrad), string(OptimizerLion)}

// optimizerSpecs is the "optimizer" section as the key index sees it.
func optimizerSpecs(c *Config) []spec {
	params := make([]spec, len(optimizerParams))
	for i, p := range optimizerParams {
		if p.read == nil {
			params[i] = spec{name: p.name, ignored: true}
		} else {
			params[i] = leaf(p.name, p.read(c))
		}
	}
	return []spec{leaf("type", optimizerType), section("params", params...), {name: "legacy_fusion", ignored: true}}
}

// optimizerSection reads "optimizer": its type first (wherever it is
// written; Adam when absent), then the params that type has; a key of
// another type's params is refused, naming the types it belongs to.
func optimizerSection(c *Config) reader {
	return func(d *decoder, n *node, key string) {
		if n.kind != kObject {
			d.typeProblem(n, key, "an object {\"type\": ..., \"params\": {...}}")
			return
		}
		for _, m := range n.members {
			if m.key == "type" && m.val.kind != kNull {
				optimizerType(d, m.val, key+".type")
			}
		}
		t := d.c.Optimizer.Type
		if !slices.Contains(optimizerTypes, string(t)) {
			// Validate reports the type; read the params as Adam's meanwhile.
			t = OptimizerAdam
		}
		params := make([]spec, 0, len(optimizerParams))
		for _, p := range optimizerParams {
			switch {
			case !slices.Contains(p.types, t):
				owners := make([]string, len(p.types))
				for i, o := range p.types {
					owners[i] = string(o)
				}
				params = append(params, leaf(p.name, func(d *decoder, n *node, key string) {
					d.valueProblem(n, key, fmt.Sprintf("is not a parameter of %s (it belongs to %s)", t, strings.Join(owners, ", ")), "")
				}))
			case p.read == nil:
				params = append(params, spec{name: p.name, ignored: true})
			default:
				params = append(params, leaf(p.name, p.read(d.c)))
			}
		}
		d.object(n, key, []spec{leaf("type", func(*decoder, *node, string) {}), section("params", params...), {name: "legacy_fusion", ignored: true}})
	}
}

// resolveOptimizer fills the defaults that depend on the type, for the
// keys the file does not give.
func (d *decoder) resolveOptimizer() {
	o := &d.c.Optimizer
	given := func(k string) bool {
		n, ok := d.set["optimizer.params."+k]
		return ok && !(n.kind == kString && n.str == "auto")
	}
	switch o.Type {
	case OptimizerAdagrad:
		if !given("lr") {
			o.LR = 1e-2
		}
		if !given("eps") {
			o.Eps = 1e-10
		}
	case OptimizerLion:
		if !given("lr") {
			o.LR = 1e-4
		}
		if !given("betas") {
			o.Betas = [2]float64{0.9, 0.99}
		}
	}
}

// validateOptimizer checks the keys of the non-Adam types.
func (c *Config) validateOptimizer(k *checker) {
	o := &c.Optimizer
	p := "optimizer.params."
	switch o.Type {
	case OptimizerSGD:
		k.float32Key(p+"momentum", o.Momentum, o.Momentum >= 0, "a finite number >= 0")
		k.float32Key(p+"dampening", o.Dampening, o.Dampening == o.Dampening, "a finite number")
		if o.Nesterov && (!(o.Momentum > 0) || o.Dampening != 0) {
			k.add(p+"nesterov", "true", fmt.Sprintf("needs momentum > 0 and dampening 0 (they are %v and %v), as in torch.optim.SGD", formatFloat(o.Momentum), formatFloat(o.Dampening)), "")
		}
	case OptimizerAdagrad:
		for _, x := range []struct {
			key string
			v   float64
		}{{"lr_decay", o.LRDecay}, {"initial_accumulator_value", o.InitialAccumulatorValue}} {
			k.float32Key(p+x.key, x.v, x.v >= 0, "a finite number >= 0")
		}
	}
}

func isInf(v float64) bool { return v > 1.7976931348623157e308 || v < -1.7976931348623157e308 }

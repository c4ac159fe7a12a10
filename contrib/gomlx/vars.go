package zgomlx

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/gomlx/compute/shapes"
	"github.com/gomlx/gomlx/ml/model"

	"github.com/zinfio/zinf/contrib/gomlx/internal/layerexec"
	"github.com/zinfio/zinf/tensor"
)

// Var is one variable of a model.Store that zinf holds: its path (the
// zinf tensor name), its shape and dtype as in the Store, and its layer.
type Var struct {
	// Name is the variable's absolute path in the Store ("/block_0/attn/...").
	Name string
	// Shape is the variable's shape, dtype included.
	Shape shapes.Shape
	// Layer is the index of the layer holding it, in forward order.
	Layer int

	v     *model.Variable
	dtype tensor.DType // Shape.DType in zinf's vocabulary
	numel int
	class int // slot class: variables of one class share swap-in buffers
	// shared: a later layer borrows it (Layer.Borrow); it has a slot class
	// of its own, so its values stay in their buffer through a pass.
	shared   bool
	ownClass bool
	idx      int // position in the trainer's variables
	// lookup is the first layer's input whose ids are the rows the layer
	// reads (Layer.Lookups), -1 when it reads the whole variable.
	lookup int

	// Per-loop state, owned by the one loop goroutine.
	slot *slot   // the swap-in buffer holding (or last holding) its values
	cur  compBuf // the buffer an executor feeds for it now
}

// Bytes is the variable's size in its dtype.
// (From its Shape, so a Var that Offload.Vars returns has it too.)
func (v *Var) Bytes() int64 { return int64(v.Shape.ByteSize()) }

// DefaultFilter selects what zinf holds when Options.Filter is nil: every
// trainable variable whose dtype zinf stores (float32, bfloat16, float16).
func DefaultFilter(v *model.Variable) bool {
	_, ok := layerexec.DType(v.DType())
	return v.Trainable && ok
}

// cleanScope normalizes a scope path: a leading "/", no trailing one.
func cleanScope(s string) string {
	s = "/" + strings.Trim(s, "/")
	return s
}

// inScope reports whether path lies under scope (or is scope).
func inScope(path, scope string) bool {
	if scope == "/" {
		return true
	}
	return path == scope || strings.HasPrefix(path, scope+"/")
}

// firstScope is the first element of a variable path, as a scope.
func firstScope(path string) string {
	p := strings.TrimPrefix(path, "/")
	if i := strings.IndexByte(p, '/'); i >= 0 {
		return "/" + p[:i]
	}
	return "/" // a variable in the root scope
}

// collectVars selects the Store's variables, assigns each a layer (by the
// given scopes, or by first-level scope in creation order) and a slot
// class. Every problem is reported at once.
func collectVars(store *model.Store, filter func(*model.Variable) bool, scopes []string, also [][]string) ([]*Var, []string, error) {
	if store == nil {
		return nil, nil, errors.New("zgomlx: nil model.Store")
	}
	if filter == nil {
		filter = DefaultFilter
	}
	var errs []error
	var picked []*model.Variable
	for v := range store.IterVariables() {
		if !v.IsValid() || !filter(v) {
			continue
		}
		if _, ok := layerexec.DType(v.DType()); !ok {
			errs = append(errs, fmt.Errorf("zgomlx: variable %q: dtype %s (allowed: Float32, BFloat16, Float16; leave it out with Options.Filter)", v.Path(), v.DType()))
			continue
		}
		picked = append(picked, v)
	}
	if len(picked) == 0 && len(errs) == 0 {
		return nil, nil, errors.New("zgomlx: the Store has no variable to offload (none passed Options.Filter; create the model's variables first, e.g. with zgomlx.Initialize)")
	}
	if len(scopes) == 0 {
		for _, v := range picked {
			if s := firstScope(v.Path()); !slices.Contains(scopes, s) {
				scopes = append(scopes, s)
			}
		}
	} else {
		clean := make([]string, len(scopes))
		for i, s := range scopes {
			clean[i] = cleanScope(s)
			if slices.Contains(clean[:i], clean[i]) {
				errs = append(errs, fmt.Errorf("zgomlx: Options.Layers: scope %q is listed twice", clean[i]))
			}
		}
		scopes = clean
	}
	var vars []*Var
	classes := map[string]int{}
	for _, v := range picked {
		layer := -1
		for l, s := range scopes {
			if inScope(v.Path(), s) {
				layer = l
				break
			}
			if l < len(also) && slices.ContainsFunc(also[l], func(a string) bool { return inScope(v.Path(), cleanScope(a)) }) {
				layer = l
				break
			}
		}
		if layer < 0 {
			errs = append(errs, fmt.Errorf("zgomlx: variable %q is under none of the layer scopes %v (add its scope to Options.Layers or leave it out with Options.Filter)", v.Path(), scopes))
			continue
		}
		dt, _ := layerexec.DType(v.DType())
		key := v.Shape().String()
		c, ok := classes[key]
		if !ok {
			c = len(classes)
			classes[key] = c
		}
		vars = append(vars, &Var{Name: v.Path(), Shape: v.Shape(), Layer: layer, v: v, dtype: dt, numel: v.Shape().Size(), class: c, lookup: -1})
	}
	if len(errs) > 0 {
		return nil, nil, errors.Join(errs...)
	}
	// Layers in forward order, each layer's variables in creation order.
	slices.SortStableFunc(vars, func(a, b *Var) int { return a.Layer - b.Layer })
	for i, v := range vars {
		v.idx = i
	}
	return vars, scopes, nil
}

// groupLayers lists each layer's variables.
func groupLayers(vars []*Var, layers int) [][]*Var {
	out := make([][]*Var, layers)
	for _, v := range vars {
		out[v.Layer] = append(out[v.Layer], v)
	}
	return out
}

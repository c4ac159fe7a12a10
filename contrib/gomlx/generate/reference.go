package generate

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"

	"github.com/gomlx/compute"
	"github.com/gomlx/compute/dtypes"
	"github.com/gomlx/gomlx/core/tensors"
	"github.com/gomlx/gomlx/ml/model"
	"github.com/gomlx/gomlx/ml/zoo/transformer"
	ggen "github.com/gomlx/gomlx/ml/zoo/transformer/generate"
)

// StoreWeights reads weights from a GoMLX Store whose variables have
// values (a model trained or initialized in memory), by path.
func StoreWeights(store *model.Store) Weights { return storeWeights{store} }

type storeWeights struct{ s *model.Store }

func (w storeWeights) Read(_ context.Context, v Var, dst []float32) error {
	sv := w.s.GetVariable(v.Name)
	if sv == nil {
		return fmt.Errorf("the Store has no variable %q", v.Name)
	}
	t, err := sv.Value()
	if err != nil {
		return err
	}
	if !t.Shape().Equal(v.Shape) {
		return fmt.Errorf("the Store's %q has shape %s, the model %s", v.Name, t.Shape(), v.Shape)
	}
	var cerr error
	if err := t.ConstBytes(func(b []byte) { cerr = toFloat32(t.DType(), b, dst) }); err != nil {
		return err
	}
	return cerr
}

// InitStore builds the model with fn on a new Store and initializes its
// variables with GoMLX's initializers from seed: a fresh model, whole in
// memory (for tests, demos and the in-memory reference).
func InitStore(backend compute.Backend, fn ModelFn, seed int64) (*model.Store, error) {
	store := model.NewStore()
	store.SetParam("/"+model.ParamInitialSeed, seed)
	var m *transformer.Model
	if err := catch(func() error { m = fn(store.RootScope()); return nil }); err != nil {
		return nil, fmt.Errorf("zinf generate: ModelFn: %w", err)
	}
	if err := checkModel(m); err != nil {
		return nil, err
	}
	if _, err := discover(backend, store, m); err != nil {
		return nil, err
	}
	if err := catch(func() error { return store.InitializeVariables(backend, nil) }); err != nil {
		return nil, fmt.Errorf("zinf generate: initializing the model: %w", err)
	}
	return store, nil
}

// InMemory is the reference: GoMLX's own generate.Generator with the KV
// cache over the zoo model whose weights w gives, all in memory (the
// prompts must have one length, as GoMLX's generator needs). EOS and stop
// tokens end a sequence as Generate ends it (GoMLX's generator runs on;
// its tokens after the end are dropped).
func InMemory(ctx context.Context, backend compute.Backend, fn ModelFn, w Weights, prompts [][]int32, s Sampling) ([][]int32, error) {
	backend = WithKVCacheOps(backend)
	store := model.NewStore()
	var m *transformer.Model
	if err := catch(func() error { m = fn(store.RootScope()); return nil }); err != nil {
		return nil, fmt.Errorf("zinf generate: ModelFn: %w", err)
	}
	if err := checkModel(m); err != nil {
		return nil, err
	}
	if err := s.check(m.VocabSize); err != nil {
		return nil, err
	}
	if len(prompts) == 0 {
		return nil, errors.New("zinf generate: no prompts")
	}
	P := len(prompts[0])
	for i, p := range prompts {
		if len(p) != P {
			return nil, fmt.Errorf("zinf generate: in-memory reference: prompt %d has %d tokens, prompt 0 %d (GoMLX's generator takes prompts of one length)", i, len(p), P)
		}
	}
	vars, err := discover(backend, store, m)
	if err != nil {
		return nil, err
	}
	defer store.Finalize()
	if err := loadWeights(ctx, w, store, vars); err != nil {
		return nil, err
	}
	m.PopulateKVCacheConfigs()
	kvHeads := m.NumKVHeads
	if kvHeads == 0 {
		kvHeads = m.NumHeads
	}
	gen := ggen.New(transformer.MakeKVCacheModelFn(m)).WithKVCache(m.KVCache, kvHeads, m.HeadDim, m.DType).WithMaxLength(P + s.MaxNewTokens)
	gen.Strategy, gen.Temperature, gen.TopK, gen.TopP = s.Strategy, float32(s.Temperature), s.TopK, float32(s.TopP)
	if err := store.SetRNGStateFromSeed(s.Seed); err != nil {
		return nil, err
	}
	var out *tensors.Tensor
	if err := catch(func() error {
		var err error
		out, err = gen.Decode(backend, store.RootScope(), prompts)
		return err
	}); err != nil {
		return nil, fmt.Errorf("zinf generate: in-memory reference: %w", err)
	}
	defer finalize(out)
	var res [][]int32
	if err := catch(func() error {
		all, ok := out.Value().([][]int32)
		if !ok {
			return fmt.Errorf("generator output %s", out.Shape())
		}
		for _, seq := range all {
			g := slices.Clone(seq[P:])
			for j, t := range g {
				if s.ends(t) {
					g = g[:j+1]
					break
				}
			}
			res = append(res, g)
		}
		return nil
	}); err != nil {
		return nil, err
	}
	return res, nil
}

// fromFloat32 narrows src to dtype d into dst (round to nearest even for
// bfloat16: exact for values that came from bfloat16).
func fromFloat32(d dtypes.DType, src []float32, dst []byte) error {
	switch d {
	case dtypes.Float32:
		if len(dst) != 4*len(src) {
			return fmt.Errorf("%d bytes for %d float32 values", len(dst), len(src))
		}
		for i, f := range src {
			b := math.Float32bits(f)
			dst[4*i], dst[4*i+1], dst[4*i+2], dst[4*i+3] = byte(b), byte(b>>8), byte(b>>16), byte(b>>24)
		}
	case dtypes.BFloat16:
		if len(dst) != 2*len(src) {
			return fmt.Errorf("%d bytes for %d bfloat16 values", len(dst), len(src))
		}
		for i, f := range src {
			b := math.Float32bits(f)
			if f == f { // not NaN: round to nearest even
				b += 0x7fff + (b>>16)&1
			}
			h := uint16(b >> 16)
			dst[2*i], dst[2*i+1] = byte(h), byte(h>>8)
		}
	default:
		return fmt.Errorf("dtype %s (allowed: float32, bfloat16)", d)
	}
	return nil
}

// loadWeights sets each of vars in store to its weights from w, read as
// float32 and converted to the variable's dtype, one variable at a time
// through one reused buffer (the in-memory references hold the whole
// model; the buffer holds its largest tensor once).
func loadWeights(ctx context.Context, w Weights, store *model.Store, vars []Var) error {
	var buf []float32
	for _, v := range vars {
		if err := ctx.Err(); err != nil {
			return err
		}
		n := v.Numel()
		if cap(buf) < n {
			buf = make([]float32, n)
		}
		if err := w.Read(ctx, v, buf[:n]); err != nil {
			return fmt.Errorf("zinf generate: weights of %q: %w", v.Name, err)
		}
		t := tensors.FromShape(v.Shape)
		var cerr error
		if err := t.MutableBytes(func(b []byte) { cerr = fromFloat32(v.Shape.DType, buf[:n], b) }); err != nil {
			return err
		}
		if cerr != nil {
			return cerr
		}
		if err := store.GetVariable(v.Name).SetValue(t); err != nil {
			return err
		}
	}
	return nil
}

package zgomlx_test

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/gomlx/compute/dtypes"
	"github.com/gomlx/compute/shapes"
	. "github.com/gomlx/gomlx/core/graph" //nolint:revive
	"github.com/gomlx/gomlx/ml/model"

	zgomlx "github.com/zinfio/zinf/contrib/gomlx"
)

// TestRegisterRoundTrip registers a Store's variables (fp32, bf16 and
// fp16 models, odd shapes, a scalar, a frozen variable) and reads every
// one back: same bytes, same shape and dtype, each in the layer of its
// scope; the Store keeps the shapes but no longer the values, except for
// what the filter left out.
func TestRegisterRoundTrip(t *testing.T) {
	for _, dt := range []dtypes.DType{dtypes.Float32, dtypes.BFloat16, dtypes.Float16} {
		t.Run(dt.String(), func(t *testing.T) {
			ctx := watchdog(t, 2*time.Minute)
			b := backend(t)
			store := model.NewStore()
			store.SetParam(model.ParamInitialSeed, int64(7))
			// Values straight from the RNG: every bit pattern counts.
			for _, v := range []struct {
				path string
				dims []int
			}{
				{"/embed/table", []int{97, 13}},
				{"/block_0/attn/w", []int{13, 3, 5}},
				{"/block_0/attn/b", []int{15}},
				{"/block_0/scale", nil},
				{"/block_1/mlp/w", []int{13, 1001}},
				{"/head/w", []int{1001, 2}},
			} {
				store.VariableWithShape(v.path, shapes.Make(dt, v.dims...), func(g *Graph, s shapes.Shape) *Node {
					return ConvertDType(MulScalar(store.RandomNormal(g, shapes.Make(dtypes.Float32, s.Dimensions...)), 3), s.DType)
				})
			}
			frozen := store.VariableWithShape("/block_1/frozen", shapes.Make(dt, 4), Ones)
			frozen.SetTrainable(false)
			if err := store.InitializeVariables(b, nil); err != nil {
				t.Fatal(err)
			}
			want := map[string][]byte{}
			for v := range store.IterVariables() {
				want[v.Path()] = valueBytes(t, v.MustValue())
			}
			cfg := testConfig(t, 8<<20)
			cfg.BF16 = dt == dtypes.BFloat16
			cfg.FP16 = dt == dtypes.Float16
			off, err := zgomlx.Register(ctx, cfg, store, zgomlx.Options{})
			if err != nil {
				t.Fatal(err)
			}
			defer off.Close()
			if off.Layers() != 4 || off.LayerScope(0) != "/embed" || off.LayerScope(3) != "/head" {
				t.Fatalf("layers %d: %q .. %q", off.Layers(), off.LayerScope(0), off.LayerScope(off.Layers()-1))
			}
			layerOf := map[string]int{"/embed/table": 0, "/block_0/attn/w": 1, "/block_0/attn/b": 1, "/block_0/scale": 1, "/block_1/mlp/w": 2, "/head/w": 3}
			vars := off.Vars()
			if len(vars) != len(layerOf) {
				t.Fatalf("%d variables registered, want %d (the frozen one left out)", len(vars), len(layerOf))
			}
			for _, v := range vars {
				if v.Layer != layerOf[v.Name] || v.Shape.DType != dt {
					t.Errorf("%s: layer %d dtype %s, want layer %d dtype %s", v.Name, v.Layer, v.Shape.DType, layerOf[v.Name], dt)
				}
				sv := store.GetVariable(v.Name)
				if sv.HasValue() {
					t.Errorf("%s: the Store still holds its value after Register", v.Name)
				}
				if !sv.Shape().Equal(v.Shape) {
					t.Errorf("%s: the Store's shape is %s, registered %s", v.Name, sv.Shape(), v.Shape)
				}
				got, err := off.ReadVariable(ctx, v.Name)
				if err != nil {
					t.Fatal(err)
				}
				if !got.Shape().Equal(v.Shape) {
					t.Fatalf("%s: read back as %s", v.Name, got.Shape())
				}
				if !bytes.Equal(valueBytes(t, got), want[v.Name]) {
					t.Fatalf("%s: bytes read back differ from the Store's", v.Name)
				}
			}
			if !frozen.HasValue() || !bytes.Equal(valueBytes(t, frozen.MustValue()), want["/block_1/frozen"]) {
				t.Error("the variable the filter left out lost its value")
			}
			// Restore gives the values back to the Store.
			if err := off.Restore(ctx); err != nil {
				t.Fatal(err)
			}
			for _, v := range vars {
				if !bytes.Equal(valueBytes(t, store.GetVariable(v.Name).MustValue()), want[v.Name]) {
					t.Fatalf("%s: restored bytes differ", v.Name)
				}
			}
		})
	}
}

// TestRegisterRefusesBadInput: problems are reported by variable and
// option, and nothing is taken from the Store.
func TestRegisterRefusesBadInput(t *testing.T) {
	ctx := watchdog(t, time.Minute)
	b := backend(t)
	store := model.NewStore()
	store.VariableWithShape("/a/w", shapes.Make(dtypes.Float32, 3), Ones)
	store.VariableWithShape("/b/w", shapes.Make(dtypes.Float64, 3), Ones)
	if err := store.InitializeVariables(b, nil); err != nil {
		t.Fatal(err)
	}
	cfg := testConfig(t, 8<<20)
	_, err := zgomlx.Register(ctx, cfg, store, zgomlx.Options{Filter: func(*model.Variable) bool { return true }, Layers: []string{"/a", "/a"}})
	if err == nil || !strings.Contains(err.Error(), `"/b/w": dtype Float64`) || !strings.Contains(err.Error(), `"/a" is listed twice`) {
		t.Fatalf("want the float64 variable and the repeated layer named, got %v", err)
	}
	_, err = zgomlx.Register(ctx, cfg, store, zgomlx.Options{Layers: []string{"/c"}})
	if err == nil || !strings.Contains(err.Error(), `"/a/w" is under none of the layer scopes`) {
		t.Fatalf("want the unplaced variable named, got %v", err)
	}
	empty := model.NewStore()
	empty.VariableWithShape("/a/w", shapes.Make(dtypes.Float32, 3), Ones)
	if _, err := zgomlx.Register(ctx, cfg, empty, zgomlx.Options{}); err == nil || !strings.Contains(err.Error(), `"/a/w" has no value`) {
		t.Fatalf("want the variable without a value named, got %v", err)
	}
	small := testConfig(t, 1)
	if _, err := zgomlx.Register(ctx, small, store, zgomlx.Options{}); err == nil || !strings.Contains(err.Error(), "cpu_pinned_bytes") {
		t.Fatalf("want the pool refused by its key, got %v", err)
	}
	if !store.GetVariable("/a/w").HasValue() {
		t.Fatal("a refused Register released a value")
	}
}

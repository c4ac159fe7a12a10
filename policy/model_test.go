package policy

import (
	"errors"
	"strings"
	"testing"

	"github.com/zinfio/zinf/tensor"
)

func TestParseModelSpec(t *testing.T) {
	m, err := ParseModelSpec("layers=24,width=4096,dtype=bf16,batch=8,world=1")
	if err != nil {
		t.Fatal(err)
	}
	want := ModelSpec{Layers: 24, Width: 4096, DType: tensor.BFloat16, Batch: 8, World: 1}
	if m != want {
		t.Fatalf("got %+v, want %+v", m, want)
	}
	m, err = ParseModelSpec(" width = 8 , layers=2 ")
	if err != nil {
		t.Fatal(err)
	}
	if (m != ModelSpec{Layers: 2, Width: 8, DType: tensor.Float32, Batch: 1, World: 1}) {
		t.Fatalf("defaults: %+v", m)
	}
	if m.String() != "layers=2,width=8,dtype=fp32,batch=1,world=1" {
		t.Errorf("String() = %q", m.String())
	}
}

func TestParseModelSpecErrors(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{"", "empty"},
		{"layers=2", "width is required"},
		{"width=2", "layers is required"},
		{"layers=0,width=2", "layers=\"0\": want an integer in 1..1048576"},
		{"layers=x,width=2", "layers=\"x\""},
		{"layers=2,width=2,dtype=fp8", "dtype=\"fp8\": want fp32, bf16 or fp16"},
		{"layers=2,width=2,depth=3", "unknown key \"depth\" (keys: layers, width, dtype, batch, world)"},
		{"layers=2,width=2,layers=3", "key layers given twice"},
		{"layers=2,,width=2", "empty item"},
		{"layers=2,width", "item \"width\" is not key=value"},
		{"layers=2,width=2,world=0", "world=\"0\": want an integer in 1..65536"},
		{"layers=2,width=2,batch=-1", "batch=\"-1\""},
		{"layers=2,width=99999999999", "width="},
	} {
		_, err := ParseModelSpec(c.in)
		if err == nil || !strings.Contains(err.Error(), c.want) || !errors.Is(err, ErrInvalid) {
			t.Errorf("ParseModelSpec(%q) = %v, want an ErrInvalid containing %q", c.in, err, c.want)
		}
	}
}

func FuzzParseModelSpec(f *testing.F) {
	f.Add("layers=24,width=4096,dtype=bf16,batch=8,world=1")
	f.Add("width=1,layers=1")
	f.Add("layers=1,width=1,dtype=half,world=65536")
	f.Add(",=,")
	f.Fuzz(func(t *testing.T, s string) {
		m, err := ParseModelSpec(s)
		if err != nil {
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("error %v is not ErrInvalid", err)
			}
			return
		}
		back, err := ParseModelSpec(m.String())
		if err != nil || back != m {
			t.Fatalf("round trip of %q: %+v -> %q -> %+v, %v", s, m, m.String(), back, err)
		}
	})
}

func TestInventory(t *testing.T) {
	m := ModelSpec{Layers: 3, Width: 5, DType: tensor.BFloat16, Batch: 1, World: 1}
	for _, world := range []int{1, 2, 4} {
		inv := m.Inventory(1, world)
		if len(inv) != 3*2*5 {
			t.Fatalf("world %d: %d tensors, want 30", world, len(inv))
		}
		byName := map[string]Tensor{}
		orders := map[int]bool{}
		for _, x := range inv {
			if _, dup := byName[x.Name]; dup {
				t.Fatalf("%q listed twice", x.Name)
			}
			byName[x.Name] = x
			if orders[x.Order] {
				t.Fatalf("order %d used twice", x.Order)
			}
			orders[x.Order] = true
		}
		ceil := func(n int) int64 { return int64((n + world - 1) / world) }
		for _, c := range []struct {
			name  string
			kind  Kind
			bytes int64
		}{
			{"layer001.weight", Param, ceil(25) * 2},
			{"layer001.bias", Param, ceil(5) * 2},
			{"layer001.weight.grad", Grad, ceil(25) * 4},
			{"layer002.bias.grad", Grad, ceil(5) * 4},
			{"layer000.weight.master", OptimState, ceil(25) * 4},
			{"layer000.weight.exp_avg", OptimState, ceil(25) * 4},
			{"layer002.bias.exp_avg_sq", OptimState, ceil(5) * 4},
		} {
			x, ok := byName[c.name]
			if !ok || x.Kind != c.kind || x.Bytes != c.bytes {
				t.Errorf("world %d: %q = %+v (present %v), want kind %s, %d bytes", world, c.name, x, ok, c.kind, c.bytes)
			}
		}
		// Forward 0..L-1, then backward L-1..0.
		fw := []string{"layer000.weight", "layer001.weight", "layer002.weight"}
		for i := 1; i < len(fw); i++ {
			if byName[fw[i-1]].Order >= byName[fw[i]].Order {
				t.Errorf("forward order: %s before %s", fw[i], fw[i-1])
			}
		}
		if byName["layer002.weight.grad"].Order >= byName["layer000.weight.grad"].Order ||
			byName["layer000.weight.grad"].Order <= byName["layer002.weight"].Order {
			t.Error("backward order: gradients not produced L-1..0 after the forward pass")
		}
		if byName["layer001.bias.grad"].Layer != 1 {
			t.Error("gradient layer")
		}
	}
	if got := m.ParamCount(); got != 3*(25+5) {
		t.Errorf("ParamCount = %d", got)
	}
}

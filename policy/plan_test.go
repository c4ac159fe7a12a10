package policy

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite the golden files under testdata/")

// planCase is one golden input: testdata/plan/NAME.json, whose expected
// output is testdata/plan/NAME.golden.
type planCase struct {
	Comment string `json:"comment"`
	// Model is a ParseModelSpec string; its inventory is planned.
	Model string `json:"model"`
	// Rank and World pick the partition (World 0 = the model's).
	Rank  int   `json:"rank"`
	World int   `json:"world"`
	Tiers Tiers `json:"tiers"`
	Hints Hints `json:"hints"`
	// DeviceFLOPs, when set and Hints.ComputeSecondsPerLayer is not,
	// derives the compute time per layer from the model.
	DeviceFLOPs float64 `json:"device_flops"`
}

func runPlanCase(t *testing.T, path string) string {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var c planCase
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&c); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	spec, err := ParseModelSpec(c.Model)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	if c.DeviceFLOPs > 0 && c.Hints.ComputeSecondsPerLayer == 0 {
		c.Hints.ComputeSecondsPerLayer = spec.FLOPsPerLayer() / c.DeviceFLOPs
	}
	inv := spec.Inventory(c.Rank, c.World)

	var out strings.Builder
	fmt.Fprintf(&out, "# %s\n", c.Comment)
	world := c.World
	if world == 0 {
		world = spec.World
	}
	fmt.Fprintf(&out, "# model %s, rank %d of %d\n", spec, c.Rank, world)
	fmt.Fprintf(&out, "# hints %s\n\n", nonZeroFields(c.Hints))
	p, err := Plan(c.Tiers, inv, c.Hints)
	if err != nil {
		fmt.Fprintf(&out, "error: %v\n", err)
		return out.String()
	}
	checkInvariants(t, c.Tiers, inv, c.Hints, p)
	if err := p.WriteTable(&out); err != nil {
		t.Fatal(err)
	}
	return out.String()
}

func TestPlanGolden(t *testing.T) {
	inputs, err := filepath.Glob(filepath.Join("testdata", "plan", "*.json"))
	if err != nil {
		t.Fatal(err)
	}
	if len(inputs) == 0 {
		t.Fatal("no golden inputs under testdata/plan")
	}
	for _, in := range inputs {
		name := strings.TrimSuffix(filepath.Base(in), ".json")
		t.Run(name, func(t *testing.T) {
			got := runPlanCase(t, in)
			golden := strings.TrimSuffix(in, ".json") + ".golden"
			if *update {
				if err := os.WriteFile(golden, []byte(got), 0o644); err != nil {
					t.Fatal(err)
				}
				return
			}
			want, err := os.ReadFile(golden)
			if err != nil {
				t.Fatalf("%v (run go test ./policy -update to create it)", err)
			}
			if got != string(want) {
				t.Errorf("placement differs from %s (go test ./policy -update rewrites it)\n--- got:\n%s\n--- want:\n%s", golden, got, want)
			}
		})
	}
}

// nonZeroFields renders a struct's set fields as "Name=value ...".
func nonZeroFields(v any) string {
	rv := reflect.ValueOf(v)
	var parts []string
	for i := 0; i < rv.NumField(); i++ {
		if f := rv.Field(i); !f.IsZero() {
			parts = append(parts, fmt.Sprintf("%s=%v", rv.Type().Field(i).Name, f.Interface()))
		}
	}
	return strings.Join(parts, " ")
}

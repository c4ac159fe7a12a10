package main

import (
	"bytes"
	"strings"
	"testing"

	"github.com/gomlx/compute/dtypes"

	zgomlx "github.com/zinfio/zinf/contrib/gomlx"
)

// TestVerifySmall runs the demo on a tiny transformer with --verify:
// offloaded training must equal in-memory training bit for bit, and the
// report must say so (and how far GoMLX's own Adam lands).
func TestVerifySmall(t *testing.T) {
	for _, bf16 := range []bool{false, true} {
		o := options{s: shape{vocab: 19, seq: 6, dim: 16, heads: 2, blocks: 3, batch: 2, dtype: dtypes.Float32},
			steps: 3, lr: 3e-3, seed: 4, verify: true, pinnedMode: "auto", backend: zgomlx.DefaultBackend, dir: t.TempDir(), bf16: bf16}
		if bf16 {
			o.s.dtype = dtypes.BFloat16
			t.Setenv("GOMLX_FUSION", "false")
		}
		var out bytes.Buffer
		if err := train(o, &out); err != nil {
			t.Fatalf("bf16 %v: %v\n%s", bf16, err, out.String())
		}
		for _, want := range []string{"state / pinned", "offloaded training equals in-memory training BIT FOR BIT", "GoMLX's Adam (eps 1e-08)"} {
			if !strings.Contains(out.String(), want) {
				t.Errorf("bf16 %v: the report lacks %q:\n%s", bf16, want, out.String())
			}
		}
	}
	if err := validate(options{s: shape{dim: 10, heads: 3}}); err == nil || !strings.Contains(err.Error(), "--dim 10 is not a multiple of --heads 3") || !strings.Contains(err.Error(), "--steps 0") {
		t.Errorf("validate: %v", err)
	}
}

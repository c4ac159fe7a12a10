package checkpoint

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"
)

func TestInspect(t *testing.T) {
	dir, specs := goodCheckpoint(t, 51)
	var b strings.Builder
	if err := Inspect(context.Background(), dir, &b); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	t.Logf("\n%s", out)
	for _, want := range []string{"step 1", "rank 0", "params.safetensors", "optimizer.safetensors", "all checksums match", specs[0].name, specs[3].name} {
		if !strings.Contains(out, want) {
			t.Errorf("Inspect output lacks %q", want)
		}
	}
	// A damaged tensor is shown as BAD and the error names it.
	r, _ := Open(dir)
	info, _ := r.Tensor(specs[1].name)
	r.Close()
	flip(t, filepath.Join(dir, "rank-00000", info.File), info.Offset+info.Bytes/2)
	b.Reset()
	err := Inspect(context.Background(), dir, &b)
	if !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), specs[1].name) {
		t.Fatalf("Inspect of a damaged checkpoint: %v", err)
	}
	if !strings.Contains(b.String(), "BAD") || !strings.Contains(b.String(), "FAILED") {
		t.Fatalf("Inspect output does not show the damage:\n%s", b.String())
	}
	// Not a checkpoint: just the error.
	b.Reset()
	if err := Inspect(context.Background(), t.TempDir(), &b); !errors.Is(err, ErrNotCheckpoint) {
		t.Fatalf("Inspect of an empty dir: %v", err)
	}
}

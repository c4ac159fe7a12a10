package checkpoint_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/zinfio/zinf/checkpoint"
	"github.com/zinfio/zinf/swapper"
)

// A user's directory in the checkpoint root is never removed by a save,
// even one whose name starts with ".tmp-" like the package's temporary
// directories, and even when the save keeps only the last checkpoint.
func TestSaveKeepsUserTmpDirectory(t *testing.T) {
	root := t.TempDir()
	notes := filepath.Join(root, ".tmp-mywork", "notes.txt")
	if err := os.MkdirAll(filepath.Dir(notes), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(notes, []byte("work\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	lockish := filepath.Join(root, ".tmp-mywork.lock")
	if err := os.WriteFile(lockish, []byte("mine\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	st := checkpoint.State{Step: 1, Ranks: []checkpoint.RankState{{Files: []checkpoint.TensorFile{{
		Name:    "params.safetensors",
		Tensors: []checkpoint.Tensor{checkpoint.FromBytes("w", swapper.Float32, []int64{2}, f32bytes(1, 2))},
	}}}}}
	for i, name := range []string{"step-000001", "step-000002"} {
		st.Step = int64(i + 1)
		if _, err := checkpoint.Save(context.Background(), filepath.Join(root, name), st, checkpoint.SaveOptions{KeepLast: 1}); err != nil {
			t.Fatal(err)
		}
	}
	if b, err := os.ReadFile(notes); err != nil || string(b) != "work\n" {
		t.Fatalf("the user's notes after two saves: %q, %v", b, err)
	}
	if b, err := os.ReadFile(lockish); err != nil || string(b) != "mine\n" {
		t.Fatalf("the user's .lock file after two saves: %q, %v", b, err)
	}
	if latest, err := checkpoint.Latest(root); err != nil || filepath.Base(latest) != "step-000002" {
		t.Fatalf("Latest = %q, %v", latest, err)
	}
}

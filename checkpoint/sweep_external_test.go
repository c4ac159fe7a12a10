package checkpoint_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
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

// RetainMatch narrows KeepLast to the checkpoints it matches: the others
// are neither counted nor deleted, whatever their step; sync and async
// saves alike.
func TestKeepLastRetainMatch(t *testing.T) {
	for _, async := range []bool{false, true} {
		root := t.TempDir()
		st := func(step int64) checkpoint.State {
			return checkpoint.State{Step: step, Ranks: []checkpoint.RankState{{Files: []checkpoint.TensorFile{{
				Name:    "params.safetensors",
				Tensors: []checkpoint.Tensor{checkpoint.FromBytes("w", swapper.Float32, []int64{2}, f32bytes(1, float32(step)))},
			}}}}}
		}
		ctx := context.Background()
		if _, err := checkpoint.Save(ctx, filepath.Join(root, "best"), st(1), checkpoint.SaveOptions{}); err != nil {
			t.Fatal(err)
		}
		mine := func(c checkpoint.Info) bool { return strings.HasPrefix(c.Name, "run-") }
		s := checkpoint.NewSaver(checkpoint.SaverOptions{})
		for step := int64(2); step <= 5; step++ {
			opts := checkpoint.SaveOptions{KeepLast: 2, RetainMatch: mine}
			dir := filepath.Join(root, fmt.Sprintf("run-%d", step))
			if async {
				h, err := s.SaveAsync(ctx, dir, st(step), opts)
				if err == nil {
					_, err = h.Wait()
				}
				if err != nil {
					t.Fatal(err)
				}
			} else if _, err := checkpoint.Save(ctx, dir, st(step), opts); err != nil {
				t.Fatal(err)
			}
		}
		s.Close()
		list, err := checkpoint.List(root)
		if err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, c := range list {
			names = append(names, c.Name)
		}
		if want := []string{"best", "run-4", "run-5"}; !slices.Equal(names, want) {
			t.Fatalf("async %v: the root holds %v, want %v", async, names, want)
		}
	}
}

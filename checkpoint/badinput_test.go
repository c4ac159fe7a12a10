package checkpoint

import (
	"context"
	"errors"
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/zinfio/zinf/swapper"
)

// goodCheckpoint saves a small one-rank checkpoint and returns its
// directory and specs.
func goodCheckpoint(t *testing.T, seed uint64) (string, []spec) {
	t.Helper()
	rng := rand.New(rand.NewPCG(seed, seed))
	specs := makeSpecs(rng, []string{"params.safetensors", "optimizer.safetensors"}, []int{4098, 64<<10 + 2, 12, 300000})
	dir := filepath.Join(t.TempDir(), "step-000001")
	st := stateOf(1, specs, fromMemory)
	st.ModelShape = map[string][]int64{"layer.0.weight": {16, 16}}
	if _, err := Save(context.Background(), dir, st, SaveOptions{}); err != nil {
		t.Fatal(err)
	}
	return dir, specs
}

// clone copies a checkpoint directory to a fresh place.
func clone(t *testing.T, src string) string {
	t.Helper()
	dst := filepath.Join(t.TempDir(), filepath.Base(src))
	if err := os.CopyFS(dst, os.DirFS(src)); err != nil {
		t.Fatal(err)
	}
	return dst
}

func editJSON(t *testing.T, path, old, new string) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), old) {
		t.Fatalf("%s has no %q", path, old)
	}
	if err := os.WriteFile(path, []byte(strings.Replace(string(b), old, new, 1)), 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestBadInput(t *testing.T) {
	good, _ := goodCheckpoint(t, 11)
	cases := []struct {
		name string
		// prepare returns the path to open, given a fresh copy of the good
		// checkpoint.
		prepare func(t *testing.T, dir string) string
		want    error
		msg     string // the error names this
	}{
		{"missing dir", func(t *testing.T, dir string) string { return filepath.Join(dir, "nope") }, ErrNotCheckpoint, "does not exist"},
		{"empty dir", func(t *testing.T, dir string) string { return t.TempDir() }, ErrNotCheckpoint, "empty"},
		{"a file", func(t *testing.T, dir string) string { return filepath.Join(dir, indexFile) }, ErrNotCheckpoint, "not a directory"},
		{"foreign dir", func(t *testing.T, dir string) string {
			d := t.TempDir()
			os.WriteFile(filepath.Join(d, "pytorch_model.bin"), []byte("x"), 0o644)
			os.WriteFile(filepath.Join(d, "config.json"), []byte("{}"), 0o644)
			return d
		}, ErrNotCheckpoint, "no checkpoint.json"},
		{"foreign checkpoint.json", func(t *testing.T, dir string) string {
			d := t.TempDir()
			os.WriteFile(filepath.Join(d, indexFile), []byte(`{"format": "orbax", "version": 1}`), 0o644)
			return d
		}, ErrNotCheckpoint, `"orbax"`},
		{"uncommitted (no checkpoint.json)", func(t *testing.T, dir string) string {
			os.Remove(filepath.Join(dir, indexFile))
			return dir
		}, ErrCorrupt, "never committed"},
		{"rank dir of an uncommitted checkpoint", func(t *testing.T, dir string) string {
			os.Remove(filepath.Join(dir, indexFile))
			return filepath.Join(dir, "rank-00000")
		}, ErrCorrupt, "uncommitted"},
		{"no rank manifest", func(t *testing.T, dir string) string {
			os.Remove(filepath.Join(dir, "rank-00000", manifestFile))
			return dir
		}, ErrCorrupt, "manifest.json is missing"},
		{"no rank dir", func(t *testing.T, dir string) string {
			os.RemoveAll(filepath.Join(dir, "rank-00000"))
			return dir
		}, ErrCorrupt, "rank-00000 is missing"},
		{"missing tensor file", func(t *testing.T, dir string) string {
			os.Remove(filepath.Join(dir, "rank-00000", "optimizer.safetensors"))
			return dir
		}, ErrCorrupt, "optimizer.safetensors of rank 0 is missing"},
		{"truncated tensor file", func(t *testing.T, dir string) string {
			p := filepath.Join(dir, "rank-00000", "params.safetensors")
			st, _ := os.Stat(p)
			os.Truncate(p, st.Size()-1)
			return dir
		}, ErrCorrupt, "params.safetensors is truncated"},
		{"version mismatch", func(t *testing.T, dir string) string {
			editJSON(t, filepath.Join(dir, indexFile), `"version": 1`, `"version": 99`)
			return dir
		}, ErrVersion, "version 99"},
		{"rank manifest version mismatch", func(t *testing.T, dir string) string {
			editJSON(t, filepath.Join(dir, "rank-00000", manifestFile), `"version": 1`, `"version": 2`)
			return dir
		}, ErrVersion, "version 2"},
		{"checkpoint.json not JSON", func(t *testing.T, dir string) string {
			os.WriteFile(filepath.Join(dir, indexFile), []byte("{\"format\": \"zinf-chec"), 0o644)
			return dir
		}, ErrCorrupt, "not valid JSON"},
		{"rank manifest edited", func(t *testing.T, dir string) string {
			editJSON(t, filepath.Join(dir, "rank-00000", manifestFile), `"step": 1`, `"step": 2`)
			return dir
		}, ErrCorrupt, "crc32c"},
		{"rank manifest from another checkpoint", func(t *testing.T, dir string) string {
			other, _ := goodCheckpoint(t, 12)
			b, _ := os.ReadFile(filepath.Join(other, "rank-00000", manifestFile))
			os.WriteFile(filepath.Join(dir, "rank-00000", manifestFile), b, 0o644)
			return dir
		}, ErrCorrupt, "recorded"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			path := c.prepare(t, clone(t, good))
			r, err := Open(path)
			if err == nil {
				r.Close()
				t.Fatalf("Open succeeded")
			}
			if !errors.Is(err, c.want) || !strings.Contains(err.Error(), c.msg) {
				t.Fatalf("Open error %q; want %v naming %q", err, c.want, c.msg)
			}
			var ce *Error
			if !errors.As(err, &ce) || ce.Path == "" {
				t.Fatalf("Open error %v is not an *Error with a path", err)
			}
			if c.name == "missing dir" && !errors.Is(err, fs.ErrNotExist) {
				t.Fatalf("missing dir: %v does not match fs.ErrNotExist", err)
			}
			if _, err := Verify(context.Background(), path); !errors.Is(err, c.want) {
				t.Fatalf("Verify error %v; want %v", err, c.want)
			}
			t.Logf("%v", err)
		})
	}
}

func TestShapeMismatch(t *testing.T) {
	dir, specs := goodCheckpoint(t, 13)
	r, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	shapes := map[string][]int64{}
	for _, s := range specs {
		shapes[s.name] = s.shape
	}
	if err := r.CheckShapes(shapes); err != nil {
		t.Fatal(err)
	}
	victim := specs[1].name
	shapes[victim] = []int64{7, 7}
	err = r.CheckShapes(shapes)
	if !errors.Is(err, ErrShape) || !strings.Contains(err.Error(), victim) || !strings.Contains(err.Error(), "[7 7]") {
		t.Fatalf("CheckShapes = %v; want ErrShape naming %s", err, victim)
	}
	shapes[victim] = specs[1].shape
	shapes["layer.99.bias"] = []int64{3}
	if err := r.CheckShapes(shapes); !errors.Is(err, ErrShape) || !strings.Contains(err.Error(), "layer.99.bias") {
		t.Fatalf("CheckShapes with a tensor the checkpoint lacks = %v", err)
	}
	if err := r.CheckModelShape(map[string][]int64{"layer.0.weight": {16, 32}}); !errors.Is(err, ErrShape) || !strings.Contains(err.Error(), "layer.0.weight") {
		t.Fatalf("CheckModelShape = %v", err)
	}
	if err := r.CheckModelShape(map[string][]int64{"layer.0.weight": {16, 16}, "layer.1.weight": {16, 16}}); !errors.Is(err, ErrShape) || !strings.Contains(err.Error(), "layer.1.weight") {
		t.Fatalf("CheckModelShape with an extra parameter = %v", err)
	}
}

func TestSaveRefuses(t *testing.T) {
	dir, specs := goodCheckpoint(t, 14)
	root := filepath.Dir(dir)
	ctx := context.Background()
	st := stateOf(2, specs, fromMemory)

	// An existing committed checkpoint without Overwrite.
	if _, err := Save(ctx, dir, st, SaveOptions{}); !errors.Is(err, ErrExists) || !strings.Contains(err.Error(), "Overwrite") {
		t.Fatalf("Save over a checkpoint: %v", err)
	}
	// Something that is not a checkpoint is never replaced, even with
	// Overwrite.
	foreign := filepath.Join(root, "precious")
	os.MkdirAll(foreign, 0o755)
	os.WriteFile(filepath.Join(foreign, "data"), []byte("keep me"), 0o644)
	if _, err := Save(ctx, foreign, st, SaveOptions{Overwrite: true}); !errors.Is(err, ErrExists) {
		t.Fatalf("Save over a foreign dir: %v", err)
	}
	if b, _ := os.ReadFile(filepath.Join(foreign, "data")); string(b) != "keep me" {
		t.Fatal("foreign directory touched")
	}
	checkReadBack(t, dir, 0, specs)

	// Invalid states: every problem reported at once.
	bad := State{Config: []byte("{not json"), Ranks: []RankState{
		{Rank: 0, Files: []TensorFile{
			{Name: "../escape.safetensors", Tensors: []Tensor{FromBytes("a", swapper.Float32, []int64{3}, make([]byte, 8))}},
			{Name: "p.safetensors", Tensors: []Tensor{
				FromBytes("dup", swapper.Float32, []int64{1}, make([]byte, 4)),
				FromBytes("dup", swapper.Float32, []int64{1}, make([]byte, 4)),
				FromBytes("__metadata__", swapper.Float32, []int64{1}, make([]byte, 4)),
				FromBytes("neg", swapper.BFloat16, []int64{-1}, nil),
			}},
			{Name: "manifest.json"},
		}},
		{Rank: 2},
	}}
	_, err := Save(ctx, filepath.Join(root, "bad"), bad, SaveOptions{})
	if !errors.Is(err, ErrInvalid) {
		t.Fatalf("Save of an invalid state: %v", err)
	}
	for _, want := range []string{"config is not valid JSON", "escape", `"a"`, "12 bytes", `"dup"`, "__metadata__", "negative", "must end in .safetensors", "rank 2 out of range"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("the error does not mention %q:\n%v", want, err)
		}
	}
	if _, err := os.Stat(filepath.Join(root, "bad")); !errors.Is(err, os.ErrNotExist) {
		t.Fatal("an invalid save created its directory")
	}
	if _, err := Save(ctx, filepath.Join(root, ".hidden"), st, SaveOptions{}); !errors.Is(err, ErrInvalid) {
		t.Fatalf("Save to a hidden name: %v", err)
	}
	if _, err := Save(ctx, filepath.Join(root, "x"), st, SaveOptions{StagingBytes: 1000}); !errors.Is(err, ErrInvalid) {
		t.Fatalf("Save with bad options: %v", err)
	}

	r, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if err := r.ReadTensor(ctx, specs[0].name, make([]byte, 3)); !errors.Is(err, ErrInvalid) {
		t.Fatalf("ReadTensor into a short buffer: %v", err)
	}
	if err := r.ReadTensor(ctx, "nope", nil); !errors.Is(err, ErrNotFound) {
		t.Fatalf("ReadTensor of an unknown tensor: %v", err)
	}
	if _, err := r.Tensor("nope"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("Tensor of an unknown tensor: %v", err)
	}
	if _, err := Latest(t.TempDir()); !errors.Is(err, ErrNoCheckpoint) {
		t.Fatalf("Latest of an empty root: %v", err)
	}
	assertNoTemp(t, root)
}

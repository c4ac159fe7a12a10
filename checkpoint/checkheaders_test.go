package checkpoint_test

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/zinfio/zinf/checkpoint"
	"github.com/zinfio/zinf/tensor"
)

// TestCheckHeaders: CheckHeaders applies ReadTensor's header rule without
// reading a tensor, so a reader that reads the bytes in place by the
// manifest's offsets refuses a header that disagrees with the manifest.
func TestCheckHeaders(t *testing.T) {
	ctx := context.Background()
	dir := filepath.Join(t.TempDir(), "ckpt")
	st := checkpoint.State{Step: 1, Ranks: []checkpoint.RankState{{Rank: 0, Files: []checkpoint.TensorFile{
		{Name: "params.safetensors", Tensors: []checkpoint.Tensor{checkpoint.FromBytes("w", tensor.Float32, []int64{32, 2}, make([]byte, 256))}},
		{Name: "other.safetensors", Tensors: []checkpoint.Tensor{checkpoint.FromBytes("m", tensor.Float32, []int64{4}, make([]byte, 16))}},
	}}}}
	if _, err := checkpoint.Save(ctx, dir, st, checkpoint.SaveOptions{}); err != nil {
		t.Fatal(err)
	}
	open := func() *checkpoint.Reader {
		r, err := checkpoint.Open(dir)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { r.Close() })
		return r
	}
	if err := open().CheckHeaders(ctx); err != nil {
		t.Fatalf("an intact checkpoint: %v", err)
	}
	if err := open().CheckHeaders(ctx, "nope"); !errors.Is(err, checkpoint.ErrNotFound) {
		t.Fatalf("an unknown tensor: %v", err)
	}
	path := filepath.Join(dir, "rank-00000", "params.safetensors")
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	i := bytes.Index(b, []byte("[32,2]"))
	if i < 0 {
		t.Fatal("no shape [32,2] in the header")
	}
	b[i+1] = '6' // [62,2]: one digit, the same length
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := open().CheckHeaders(ctx, "m"); err != nil {
		t.Fatalf("the other file's header is intact: %v", err)
	}
	err = open().CheckHeaders(ctx, "w")
	if !errors.Is(err, checkpoint.ErrCorrupt) || !bytes.Contains([]byte(err.Error()), []byte("params.safetensors")) {
		t.Fatalf("a changed shape digit: %v", err)
	}
	t.Log(err)
}

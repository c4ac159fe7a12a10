package checkpoint_test

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/zinfio/zinf/checkpoint"
	"github.com/zinfio/zinf/tensor"
)

// TestUint8Tensor: a U8 tensor (the codes of 8-bit optimizer states)
// next to an odd number of F32 and BF16 bytes saves, verifies and reads
// back byte for byte, with "U8" in the safetensors header and the
// manifest.
func TestUint8Tensor(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "step-000001")
	codes := make([]byte, 1001)
	for i := range codes {
		codes[i] = byte(i * 7)
	}
	absmax := make([]byte, 4*4)
	for i := range absmax {
		absmax[i] = byte(i + 1)
	}
	st := checkpoint.State{Step: 1, Ranks: []checkpoint.RankState{{Rank: 0, Files: []checkpoint.TensorFile{{Name: "optimizer.safetensors", Tensors: []checkpoint.Tensor{
		checkpoint.FromBytes("w.exp_avg", tensor.Uint8, []int64{1001}, codes),
		checkpoint.FromBytes("w.exp_avg.absmax", tensor.Float32, []int64{4}, absmax),
		checkpoint.FromBytes("w.half", tensor.BFloat16, []int64{3}, []byte{1, 2, 3, 4, 5, 6}),
	}}}}}}
	if _, err := checkpoint.Save(context.Background(), dir, st, checkpoint.SaveOptions{}); err != nil {
		t.Fatal(err)
	}
	rep, err := checkpoint.Verify(context.Background(), dir)
	if err != nil || !rep.OK() {
		t.Fatalf("verify: %v %+v", err, rep)
	}
	r, err := checkpoint.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	ti, err := r.Tensor("w.exp_avg")
	if err != nil || ti.DType != tensor.Uint8 || ti.Bytes != 1001 {
		t.Fatalf("tensor info %+v, %v", ti, err)
	}
	got := make([]byte, 1001)
	if err := r.ReadTensor(context.Background(), "w.exp_avg", got); err != nil || !bytes.Equal(got, codes) {
		t.Fatalf("read back: %v (equal %v)", err, bytes.Equal(got, codes))
	}
	raw, err := os.ReadFile(filepath.Join(r.Meta().RankDir, "optimizer.safetensors"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(raw[:min(len(raw), 4096)]), `"dtype":"U8"`) {
		t.Errorf("the safetensors header does not spell U8: %.300s", raw[8:])
	}
}

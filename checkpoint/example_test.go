package checkpoint_test

import (
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"os"
	"path/filepath"

	"github.com/zinfio/zinf/checkpoint"
	"github.com/zinfio/zinf/swapper"
)

func f32bytes(v ...float32) []byte {
	b := make([]byte, 4*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(x))
	}
	return b
}

// Save a checkpoint, find it again and read a tensor back.
func Example() {
	root, _ := os.MkdirTemp("", "zinf-example-")
	defer os.RemoveAll(root)
	ctx := context.Background()

	state := checkpoint.State{
		Step:   100,
		Config: []byte(`{"train_batch_size": 8}`),
		Ranks: []checkpoint.RankState{{Rank: 0, Files: []checkpoint.TensorFile{
			{Name: "params.safetensors", Tensors: []checkpoint.Tensor{
				checkpoint.FromBytes("layer.0.weight", swapper.Float32, []int64{2, 2}, f32bytes(1, 2, 3, 4)),
			}},
			{Name: "optimizer.safetensors", Tensors: []checkpoint.Tensor{
				checkpoint.FromBytes("layer.0.weight.exp_avg", swapper.Float32, []int64{2, 2}, f32bytes(0.5, 0.5, 0.5, 0.5)),
			}},
		}}},
	}
	if _, err := checkpoint.Save(ctx, filepath.Join(root, "step-000100"), state, checkpoint.SaveOptions{KeepLast: 3}); err != nil {
		fmt.Println(err)
		return
	}

	dir, _ := checkpoint.Latest(root)
	r, err := checkpoint.Open(dir)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer r.Close()
	fmt.Println(filepath.Base(dir), "step", r.Meta().Step, "tensors", r.Names())
	if err := r.CheckShapes(map[string][]int64{"layer.0.weight": {2, 2}}); err != nil {
		fmt.Println(err)
	}
	info, _ := r.Tensor("layer.0.weight")
	buf := make([]byte, info.Bytes)
	if err := r.ReadTensor(ctx, "layer.0.weight", buf); err != nil {
		fmt.Println(err)
	}
	fmt.Println(info.DType.SafetensorsName(), info.Shape, math.Float32frombits(binary.LittleEndian.Uint32(buf[12:])))
	// Output:
	// step-000100 step 100 tensors [layer.0.weight layer.0.weight.exp_avg]
	// F32 [2 2] 4
}

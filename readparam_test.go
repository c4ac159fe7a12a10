package zinf_test

import (
	"bytes"
	"runtime"
	"testing"
	"time"

	"github.com/zinfio/zinf"
	"github.com/zinfio/zinf/buffers"
	"github.com/zinfio/zinf/comm"
	"github.com/zinfio/zinf/tensor"
)

// TestReadParamBytesEveryDType reads a parameter stored in each param
// dtype into each dtype, on two ranks of one tensor with an odd length:
// every rank fills exactly its range, the bytes equal the fp32 read
// encoded in that dtype, and a steady-state read allocates no buffer of
// the tensor's size.
func TestReadParamBytesEveryDType(t *testing.T) {
	dts := []tensor.DType{tensor.Float32, tensor.BFloat16, tensor.Float16}
	for _, stored := range dts {
		t.Run(stored.String(), func(t *testing.T) {
			ctx, watch := watchdog(t, 2*time.Minute)
			const n = 30001
			vals := make([]float32, n)
			for i := range vals {
				vals[i] = float32(i%97)*0.0123 - 0.5 + float32(i)*1e-7
			}
			const world = 2
			// fp16 configs scale the loss, whose overflow check needs every
			// rank: the two ranks share a local comm.
			comms, err := comm.NewLocal(world, comm.LocalOptions{StallTimeout: time.Minute})
			if err != nil {
				t.Fatal(err)
			}
			var rts []*zinf.Runtime
			for rank := range world {
				c, _ := testConfig(t)
				c.BF16 = stored == tensor.BFloat16
				c.FP16 = stored == tensor.Float16
				rt, err := zinf.Open(c, oneTensor("w", n), zinf.Options{Rank: rank, WorldSize: world, Comm: comms[rank]})
				if err != nil {
					t.Fatal(err)
				}
				defer rt.Close()
				watch(rt)
				if err := rt.Init(ctx, "w", vals); err != nil {
					t.Fatal(err)
				}
				rts = append(rts, rt)
			}
			asStored := make([]float32, n)
			for _, rt := range rts {
				rt.Forward()
				if err := rt.BeginLayer(ctx, 0); err != nil {
					t.Fatal(err)
				}
				if err := rt.ReadParam(ctx, "w", asStored); err != nil {
					t.Fatal(err)
				}
			}
			for _, to := range dts {
				want := make([]byte, n*to.Size())
				buffers.Encode(to, want, asStored)
				got := bytes.Repeat([]byte{0xA5}, n*to.Size())
				for _, rt := range rts {
					if err := rt.ReadParamBytes(ctx, "w", to, got); err != nil {
						t.Fatal(err)
					}
				}
				if !bytes.Equal(got, want) {
					t.Fatalf("stored %s read as %s: bytes differ from the fp32 read encoded", stored, to)
				}
				if err := rts[0].ReadParamBytes(ctx, "w", to, got[:len(got)-to.Size()]); err == nil {
					t.Fatalf("read as %s accepted a buffer one element short", to)
				}
				var ms0, ms1 runtime.MemStats
				runtime.ReadMemStats(&ms0)
				for range 10 {
					if err := rts[1].ReadParamBytes(ctx, "w", to, got); err != nil {
						t.Fatal(err)
					}
				}
				runtime.ReadMemStats(&ms1)
				if per := (ms1.TotalAlloc - ms0.TotalAlloc) / 10; per >= n {
					t.Errorf("stored %s read as %s: %d bytes allocated per read of %d elements", stored, to, per, n)
				}
			}
			for _, rt := range rts {
				rt.EndLayer(0)
			}
		})
	}
}

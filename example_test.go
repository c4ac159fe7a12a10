package zinf_test

import (
	"context"
	"fmt"
	"log"
	"math"
	"os"

	"github.com/zinfio/zinf"
	"github.com/zinfio/zinf/config"
	"github.com/zinfio/zinf/plan"
	"github.com/zinfio/zinf/swapper/optimizer"
	"github.com/zinfio/zinf/tensor"
)

// Example shows the Go API a training loop uses: describe the model (its
// tensors by layer), open a runtime, which plans where each tensor lives
// and sizes the pinned memory for it, give every tensor its initial
// values, then train: each layer is begun (swapped in, the next ones
// prefetched), read, and ended; backward hands each gradient over and
// starts its tensor's update; Step commits. The model here fits
// y = 0.5 x in two layers by least squares; the trained weights equal
// plain in-memory Adam bit for bit.
func Example() {
	dir, err := os.MkdirTemp("", "zinf-example-")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)

	cfg := config.Default() // DeepSpeed keys + a zinf section; simulated GPU
	cfg.SetScratchDir(dir)  // swap files go here (removed by Close)
	cfg.Zinf.Tiers.CPUPinnedBytes = 16 << 20
	cfg.ZeroOptimization.OffloadParam.MaxInCPU = 0 // keep every parameter on NVMe
	cfg.Optimizer.LR = 0.05

	model := zinf.LayeredModel(
		[]tensor.Desc{{Name: "layer0.weight", Shape: []int{2, 4}}},
		[]tensor.Desc{{Name: "layer1.weight", Shape: []int{4}}, {Name: "layer1.bias", Shape: []int{1}}},
	)
	rt, err := zinf.Open(cfg, model, zinf.Options{})
	if err != nil {
		log.Fatal(err) // a *zinf.PoolTooSmallError names the minimum zinf.tiers.cpu_pinned_bytes
	}
	defer rt.Close()

	ctx := context.Background()
	weights := map[string][]float32{}
	for _, d := range model.Tensors {
		n, _ := d.Numel()
		w := make([]float32, n)
		for i := range w {
			w[i] = float32(i%3)*0.25 - 0.25
		}
		weights[d.Name] = w
		if err := rt.Init(ctx, d.Name, w); err != nil {
			log.Fatal(err)
		}
	}
	// The same training in memory, to compare with.
	ref := map[string][3][]float32{}
	for name, w := range weights {
		ref[name] = [3][]float32{append([]float32(nil), w...), make([]float32, len(w)), make([]float32, len(w))}
	}

	// forward is the two layers on inputs x (2 features): h = W0 x (4
	// units), y = w1 . h + b.
	x := [][2]float32{{1, 0}, {0, 1}, {1, 1}, {2, -1}}
	forward := func(w map[string][]float32) (loss float64, grads map[string][]float32) {
		w0, w1, b := w["layer0.weight"], w["layer1.weight"], w["layer1.bias"]
		grads = map[string][]float32{"layer0.weight": make([]float32, 8), "layer1.weight": make([]float32, 4), "layer1.bias": make([]float32, 1)}
		for _, xi := range x {
			var h [4]float32
			y := b[0]
			for j := range h {
				h[j] = w0[2*j]*xi[0] + w0[2*j+1]*xi[1]
				y += w1[j] * h[j]
			}
			d := y - 0.5*(xi[0]+xi[1]) // dL/dy of 0.5*(y - target)^2
			loss += 0.5 * float64(d) * float64(d)
			grads["layer1.bias"][0] += d
			for j := range h {
				grads["layer1.weight"][j] += d * h[j]
				grads["layer0.weight"][2*j] += d * w1[j] * xi[0]
				grads["layer0.weight"][2*j+1] += d * w1[j] * xi[1]
			}
		}
		return loss, grads
	}

	const steps = 20
	var first, last float64
	for step := 1; step <= steps; step++ {
		// Forward: begin each layer (a barrier for its tensors' swap-in;
		// the next layers are prefetched), read its weights, end it.
		rt.Forward()
		for l := range rt.Layers() {
			if err := rt.BeginLayer(ctx, l); err != nil {
				log.Fatal(err)
			}
			for _, name := range rt.LayerTensors(l) {
				if err := rt.ReadParam(ctx, name, weights[name]); err != nil { // fp32, whatever the stored dtype
					log.Fatal(err)
				}
			}
			rt.EndLayer(l) // read-only: no write-back
		}
		loss, grads := forward(weights)
		if step == 1 {
			first = loss
		}
		last = loss
		// Backward, last layer first: hand each gradient over (written
		// behind) and start its tensor's update now, overlapping the rest
		// of backward when the plan has room for it.
		rt.Backward()
		for l := rt.Layers() - 1; l >= 0; l-- {
			for _, name := range rt.LayerTensors(l) {
				if err := rt.AccumulateGrad(ctx, name, grads[name]); err != nil {
					log.Fatal(err)
				}
			}
			if err := rt.StepLayer(ctx, l); err != nil {
				log.Fatal(err)
			}
		}
		if err := rt.Step(ctx); err != nil {
			log.Fatal(err) // all or nothing: on a full disk nothing changed; free space and call Step again
		}
		for name, s := range ref {
			optimizer.Adam(s[0], grads[name], s[1], s[2], step, plan.Hyper(cfg))
		}
	}

	// Read the trained weights back and compare them with the in-memory run.
	equal := true
	rt.Forward()
	for l := range rt.Layers() {
		if err := rt.BeginLayer(ctx, l); err != nil {
			log.Fatal(err)
		}
		for _, name := range rt.LayerTensors(l) {
			if err := rt.ReadParam(ctx, name, weights[name]); err != nil {
				log.Fatal(err)
			}
			for i, v := range weights[name] {
				equal = equal && math.Float32bits(v) == math.Float32bits(ref[name][0][i])
			}
		}
		rt.EndLayer(l)
	}
	m := rt.Metrics()
	fmt.Printf("loss: step 1 %.4f, step %d %.4f\n", first, steps, last)
	fmt.Println("steps:", m.Steps, "bit-equal to in-memory Adam:", equal)
	fmt.Println("moved through NVMe:", m.BytesRead > 0 && m.BytesWritten > 0)
	// Output:
	// loss: step 1 1.1543, step 20 0.0407
	// steps: 20 bit-equal to in-memory Adam: true
	// moved through NVMe: true
}

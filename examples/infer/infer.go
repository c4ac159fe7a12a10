// Package infer is zinf's layer-streamed inference example (ZeRO-Inference):
// the model's weights live on NVMe and are streamed through pinned memory
// layer by layer, the next layers prefetched while the current one
// computes. With Verify the same batches run with the weights in memory and
// the outputs are compared bit for bit. `zinf infer` runs it.
package infer

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"time"

	"github.com/zinfio/zinf"
	"github.com/zinfio/zinf/config"
	"github.com/zinfio/zinf/examples/train"
	"github.com/zinfio/zinf/metrics/stats"
	"github.com/zinfio/zinf/swapper"
)

// Options configure a run.
type Options struct {
	Config *config.Config // its offload_param section says where weights live
	Spec   train.Spec
	// Batches to run (default 4).
	Batches int
	// Prefetch is the layers streamed ahead (default 2).
	Prefetch int
	// ComputePerLayer is simulated accelerator time per layer.
	ComputePerLayer time.Duration
	Verify          bool
	Progress        io.Writer
	Logger          *slog.Logger
}

// Result is what a run measured.
type Result struct {
	Batches       int     `json:"batches"`
	Params        int64   `json:"params"`
	OutputEqual   *bool   `json:"output_equal"`
	BatchMsMedian float64 `json:"batch_ms_median"`
	IOWaitMs      float64 `json:"io_wait_ms"`
	BytesRead     int64   `json:"bytes_read"`
	DemandMisses  int     `json:"demand_misses"`
	// Outputs are the last layer's activations, one Batch x Width slice per
	// batch, for callers that check them against their own reference.
	Outputs [][]float32 `json:"-"`
}

// Run streams the model's layers from NVMe for each batch.
func Run(ctx context.Context, o Options) (*Result, error) {
	if o.Config == nil {
		return nil, errors.New("infer: no config")
	}
	if o.Batches < 0 || o.Prefetch < 0 || o.ComputePerLayer < 0 {
		return nil, fmt.Errorf("infer: batches %d, prefetch %d and compute per layer %v must not be negative", o.Batches, o.Prefetch, o.ComputePerLayer)
	}
	if o.Batches == 0 {
		o.Batches = 4
	}
	if o.Prefetch == 0 {
		o.Prefetch = 2
	}
	spec := o.Spec
	if o.Config.BF16 {
		spec.DType = swapper.BFloat16
	} else if o.Config.FP16 {
		spec.DType = swapper.Float16
	}
	if err := spec.Validate(); err != nil {
		return nil, err
	}
	rt, err := zinf.Open(o.Config, spec.Model(), zinf.Options{Logger: o.Logger, Rank: 0, WorldSize: 1, Inference: true,
		PrefetchDepth: o.Prefetch, ComputePerLayer: o.ComputePerLayer})
	if err != nil {
		return nil, err
	}
	defer rt.Close()
	for _, n := range spec.ParamNames() {
		if err := rt.Init(ctx, n, spec.InitMaster(n)); err != nil {
			return nil, err
		}
	}
	W, B, L := spec.Width, spec.Batch, spec.Layers
	w := make([]float32, W*W)
	bias := make([]float32, W)
	z := make([]float32, B*W)
	a, next := make([]float32, B*W), make([]float32, B*W)
	order := make([]int, L)
	for i := range order {
		order[i] = i
	}
	res := &Result{Batches: o.Batches, Params: spec.ParamCount()}
	var times []float64
	var wait time.Duration
	outputs := make([][]float32, 0, o.Batches)
	for bi := 0; bi < o.Batches; bi++ {
		t0 := time.Now()
		x, _ := spec.Data(0, bi, 0)
		copy(a, x)
		rt.Forward()
		for l := 0; l < L; l++ {
			tw := time.Now()
			if err := rt.BeginLayer(ctx, l); err != nil {
				return nil, fmt.Errorf("batch %d layer %d: %w", bi, l, err)
			}
			wait += time.Since(tw)
			if err := rt.ReadParam(ctx, train.WeightName(l), w); err != nil {
				return nil, err
			}
			if err := rt.ReadParam(ctx, train.BiasName(l), bias); err != nil {
				return nil, err
			}
			train.Forward(a, w, bias, z, next, B, W, l == L-1)
			if o.ComputePerLayer > 0 {
				time.Sleep(o.ComputePerLayer)
			}
			rt.EndLayer(l)
			a, next = next, a
		}
		outputs = append(outputs, append([]float32(nil), a...))
		d := time.Since(t0)
		times = append(times, float64(d)/1e6)
		if o.Progress != nil {
			fmt.Fprintf(o.Progress, "batch %d/%d: %.1f ms\n", bi+1, o.Batches, float64(d)/1e6)
		}
	}
	res.Outputs = outputs
	res.BatchMsMedian = medianOf(times)
	res.IOWaitMs = float64(wait) / 1e6
	m := rt.Metrics()
	res.DemandMisses = int(m.Schedule.DemandMisses)
	res.BytesRead = m.BytesRead
	if !o.Verify {
		return res, nil
	}
	eq := true
	for bi := 0; bi < o.Batches && eq; bi++ {
		x, _ := spec.Data(0, bi, 0)
		copy(a, x)
		for l := 0; l < L; l++ {
			wv, bv := spec.InitMaster(train.WeightName(l)), spec.InitMaster(train.BiasName(l))
			spec.Quantize(wv)
			spec.Quantize(bv)
			train.Forward(a, wv, bv, z, next, B, W, l == L-1)
			a, next = next, a
		}
		for i := range a {
			if math.Float32bits(a[i]) != math.Float32bits(outputs[bi][i]) {
				eq = false
				break
			}
		}
	}
	res.OutputEqual = &eq
	return res, nil
}

func medianOf(v []float64) float64 {
	return stats.Median(v)
}

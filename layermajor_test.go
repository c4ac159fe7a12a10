package zinf_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/zinfio/zinf"
	"github.com/zinfio/zinf/config"
	"github.com/zinfio/zinf/tensor"
)

// scheduleCase is a fixed case of the differential harness: two layers
// of three tensors on NVMe, fp16 with a dynamic loss scale and an
// overflow on the second step, gradient clipping that triggers on some
// steps, k micro-batches per step, one optimizer rule.
func scheduleCase(t *testing.T, rule string, k int, layerMajor bool) *stepCase {
	c := &stepCase{overflowAt: map[[2]int]string{}, faultStep: -1, micro: k, steps: 4, layerMajor: layerMajor, overlapped: new(atomic.Int64), recovered: new(atomic.Int64)}
	c.setLayers([][]int{{509, 61}, {1021, 7}})
	c.world = 1
	if k == 3 {
		c.world = 2 // partitions too
	}
	cfg := config.Default()
	cfg.SetScratchDir(t.TempDir())
	cfg.Zinf.Tiers.CPUPinnedBytes = 32 << 20
	cfg.Zinf.PinnedGrads = config.PinnedGradsOff   // the gradients' NVMe round trip is what these tests count
	cfg.ZeroOptimization.OffloadParam.MaxInCPU = 0 // every swap-in reads NVMe
	cfg.ZeroOptimization.SubGroupSize = 1000
	cfg.Optimizer.LR, cfg.Optimizer.WeightDecay = 0.01, 0.01
	switch rule {
	case "adam":
		cfg.Optimizer.Type = config.OptimizerAdam
	case "adamw":
		cfg.Optimizer.Type = config.OptimizerAdamW
	case "sgd":
		cfg.Optimizer.Type = config.OptimizerSGD
	case "sgd-momentum":
		cfg.Optimizer.Type, cfg.Optimizer.Momentum, cfg.Optimizer.Dampening = config.OptimizerSGD, 0.9, 0.1
	case "sgd-nesterov":
		cfg.Optimizer.Type, cfg.Optimizer.Momentum, cfg.Optimizer.Nesterov = config.OptimizerSGD, 0.8, true
	case "adagrad":
		cfg.Optimizer.Type, cfg.Optimizer.Eps, cfg.Optimizer.LRDecay, cfg.Optimizer.InitialAccumulatorValue = config.OptimizerAdagrad, 1e-10, 0.05, 0.1
	case "lion":
		cfg.Optimizer.Type, cfg.Optimizer.Betas, cfg.Optimizer.LR = config.OptimizerLion, [2]float64{0.9, 0.99}, 1e-3
	default:
		t.Fatalf("rule %q", rule)
	}
	cfg.FP16 = true
	cfg.LossScaling.InitialScalePower, cfg.LossScaling.LossScaleWindow, cfg.LossScaling.Hysteresis = 10, 2, 1
	cfg.LossScaling.MinLossScale = 1.0 / 1024
	c.overflowAt[[2]int{1, k - 1}] = "l1.t0" // the last micro-batch: every order has summed the rest
	cfg.GradientClipping = -1                // near the first step's norm (stepCase.run)
	cfg.GradientAccumulationSteps = k
	cfg.Zinf.Schedule = config.ScheduleMicroBatchMajor
	if layerMajor {
		cfg.Zinf.Schedule = config.ScheduleLayerMajor
	}
	c.cfg = cfg
	return c
}

// TestLayerMajorBitExact trains the same steps in both orders — layer-major
// (BeginLayerMicroBatches: every micro-batch of a layer at once, each
// gradient summed in pinned memory and written once) and
// micro-batch-major — for k = 1, 3 and 8 micro-batches and every
// optimizer rule, with fp16 loss scaling (an overflow skips a step) and
// gradient clipping: each order's every parameter read, every step's
// decision and the final masters and optimizer states equal the in-memory
// reference bit for bit (so each other). Layer-major writes each gradient
// once per step where micro-batch-major writes it k times, and reads the
// parameters k times less.
func TestLayerMajorBitExact(t *testing.T) {
	rules := []string{"adam", "adamw", "sgd", "sgd-momentum", "sgd-nesterov", "adagrad", "lion"}
	for _, rule := range rules {
		for _, k := range []int{1, 3, 8} {
			t.Run(fmt.Sprintf("%s/k%d", rule, k), func(t *testing.T) {
				type io struct{ gradWrites, paramReads int64 }
				var got [4]io
				c0 := scheduleCase(t, rule, k, false)
				for i, lm := range []bool{false, true, true, true} {
					c := scheduleCase(t, rule, k, lm)
					c.ahead = i == 2 // two layers begun at once in the backward pass
					c.pairs = i == 3 // micro-batches handed over two at a time
					seed := uint64(k*100 + len(rule))
					rts := c.run(t, seed, rand.New(rand.NewPCG(seed, 1)))
					if t.Failed() {
						return
					}
					if s := rts[0].Schedule(); lm != (s == zinf.LayerMajor) {
						t.Fatalf("layer-major %v: the runtime's schedule is %s (zinf.schedule %s)", lm, s, c.cfg.Zinf.Schedule)
					}
					for _, rt := range rts {
						m := rt.Metrics()
						got[i].gradWrites += m.Grads.Writes
						got[i].paramReads += m.Params.SwapIns
					}
				}
				mb, lm := got[0], got[1]
				if mb.gradWrites != int64(k)*lm.gradWrites || lm.gradWrites == 0 {
					t.Errorf("gradient writes: micro-batch-major %d, layer-major %d; want a ratio of k = %d", mb.gradWrites, lm.gradWrites, k)
				}
				if got[3].gradWrites != lm.gradWrites {
					t.Errorf("gradient writes: layer-major %d, in pairs %d (want the same)", lm.gradWrites, got[3].gradWrites)
				}
				if got[2].gradWrites != lm.gradWrites {
					t.Errorf("gradient writes: layer-major %d, with the next layer begun ahead %d (want the same: each layer's sums held until its k-th)", lm.gradWrites, got[2].gradWrites)
				}
				// Each order reads each partition twice per pass pair: once
				// a step layer-major, k times micro-batch-major (a prefetch
				// that lost its buffer to a demand read reads once more).
				base := 2 * 4 * int64(c0.world*len(c0.model.Tensors))
				within := func(n, want int64) bool { return n >= want && n <= want+want/10+2 }
				if !within(lm.paramReads, base) || !within(mb.paramReads, int64(k)*base) {
					t.Errorf("parameter swap-ins: layer-major %d (want %d), micro-batch-major %d (want %d)", lm.paramReads, base, mb.paramReads, int64(k)*base)
				}
			})
		}
	}
}

// TestMeasuredComputePerLayer: the runtime measures the loop's compute
// between BeginLayer and EndLayer per layer, pass and micro-batch — a
// layer-major visit of k micro-batches counts k — and zinf.PlanModel
// predicts the step from it: the compute of a plan made with the measured
// figure is at least the loop's sleeps.
func TestMeasuredComputePerLayer(t *testing.T) {
	c := scheduleCase(t, "adam", 4, true)
	c.cfg.GradientClipping = 0
	ctx, watch := watchdog(t, time.Minute)
	rt, err := zinf.Open(c.cfg, c.model, zinf.Options{Logger: quietLog, NoBandwidthProbe: true})
	if err != nil {
		t.Fatal(err)
	}
	defer rt.Close()
	watch(rt)
	if d := rt.MeasuredComputePerLayer(); d != 0 {
		t.Fatalf("measured %v before any layer", d)
	}
	for _, d := range c.model.Tensors {
		if err := rt.Init(ctx, d.Name, make([]float32, c.numel[d.Name])); err != nil {
			t.Fatal(err)
		}
	}
	const visit = 20 * time.Millisecond
	for l := range c.layers {
		if err := rt.BeginLayerMicroBatches(ctx, l, 4); err != nil {
			t.Fatal(err)
		}
		time.Sleep(visit) // four micro-batches of 5 ms
		rt.EndLayer(l)
	}
	got := rt.MeasuredComputePerLayer()
	if got < visit/4 || got >= visit {
		t.Fatalf("measured %v per layer and micro-batch for visits of %v over 4 micro-batches", got, visit)
	}
	if m := rt.Metrics(); m.ComputeUnits != int64(4*len(c.layers)) || m.Compute < time.Duration(len(c.layers))*visit {
		t.Fatalf("metrics: %v over %d units", m.Compute, m.ComputeUnits)
	}
	p, err := zinf.PlanModel(ctx, c.cfg, c.model, zinf.Options{ComputePerLayer: got, NoBandwidthProbe: true})
	if err != nil {
		t.Fatal(err)
	}
	// Two passes of every layer, k micro-batches each.
	if want := 2 * 4 * time.Duration(len(c.layers)) * (visit / 4); p.Placement.PredictedLayerMajor.Compute < want*99/100 {
		t.Fatalf("planned compute %v, want >= %v", p.Placement.PredictedLayerMajor.Compute, want)
	}
}

// TestMeasuredCosts: after training steps the runtime reports the CPU
// costs on its I/O path as rates (Runtime.MeasuredCosts): the checksums'
// rate with zinf.checksums on (none with it off), the gradient
// hand-offs' (every micro-batch's gradient of every tensor, counted in
// the gradient swapper's HandOffBytes), the optimizer's arithmetic per
// step. The planner's prediction with them (Placement.WithCosts) is
// longer than without.
func TestMeasuredCosts(t *testing.T) {
	for _, sums := range []bool{true, false} {
		t.Run(fmt.Sprintf("checksums=%v", sums), func(t *testing.T) {
			const k = 4
			c := scheduleCase(t, "adam", k, true)
			c.cfg.Zinf.Checksums = sums
			rts := c.run(t, 7, rand.New(rand.NewPCG(7, 1)))
			if t.Failed() {
				return
			}
			rt := rts[0]
			got := rt.MeasuredCosts()
			if sums != (got.ChecksumBytesPerSec > 0) || math.IsInf(got.ChecksumBytesPerSec, 0) || math.IsNaN(got.ChecksumBytesPerSec) {
				t.Errorf("checksums %v: measured %g B/s of CRC-32C", sums, got.ChecksumBytesPerSec)
			}
			if !(got.HandOffBytesPerSec > 0) || math.IsInf(got.HandOffBytesPerSec, 0) {
				t.Errorf("hand-offs: %g B/s", got.HandOffBytesPerSec)
			}
			if !(got.OptimizerComputeSeconds > 0) || got.OptimizerComputeSeconds > 10 {
				t.Errorf("optimizer arithmetic: %g s per step", got.OptimizerComputeSeconds)
			}
			var elems int64
			for _, n := range c.numel {
				elems += int64(n)
			}
			if hb, want := rt.Metrics().Grads.HandOffBytes, int64(c.steps*k)*4*elems; hb != want {
				t.Errorf("hand-off bytes %d, want %d (%d steps x %d micro-batches x %d fp32 gradients)", hb, want, c.steps, k, elems)
			}
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			p, err := zinf.PlanModel(ctx, c.cfg, c.model, zinf.Options{ComputePerLayer: time.Millisecond, NoBandwidthProbe: true})
			if err != nil {
				t.Fatal(err)
			}
			with := p.Placement.WithCosts(got)
			if !(with.PredictedLayerMajor.Total > p.Placement.PredictedLayerMajor.Total) {
				t.Errorf("with the measured costs the step is %v, without %v", with.PredictedLayerMajor.Total, p.Placement.PredictedLayerMajor.Total)
			}
		})
	}
}

// TestLayerMajorOneMicroBatchHoldsNothing: layer-major holds a layer's
// gradients in pinned memory only to sum k > 1 micro-batches; at k = 1
// each gradient is handed once and written behind, so the plan reserves
// what micro-batch-major does (the extra reservation took pinned memory
// from the prefetch window and left more gradients to flush at Step:
// Step's tail after the backward pass 88..123 ms vs 25..64 ms
// micro-batch-major on bench-schedule's model, 39..52 ms after).
func TestLayerMajorOneMicroBatchHoldsNothing(t *testing.T) {
	grads := map[string]int64{}
	for _, k := range []int{1, 4} {
		for _, layerMajor := range []bool{false, true} {
			c := scheduleCase(t, "adam", k, layerMajor)
			c.cfg.GradientClipping = 0 // scheduleCase sets it from its first step
			plan, err := zinf.PlanModel(context.Background(), c.cfg, c.model, zinf.Options{WorldSize: c.world, NoBandwidthProbe: true})
			if err != nil {
				t.Fatal(err)
			}
			grads[fmt.Sprintf("k%d/%v", k, layerMajor)] = plan.Reservations.GradBytes
		}
	}
	if lm, mb := grads["k1/true"], grads["k1/false"]; lm != mb {
		t.Errorf("k=1: layer-major reserves %d bytes for gradients, micro-batch-major %d: one micro-batch holds nothing", lm, mb)
	}
	if lm, mb := grads["k4/true"], grads["k4/false"]; lm <= mb {
		t.Errorf("k=4: layer-major reserves %d bytes for gradients, micro-batch-major %d: a layer's sums are held in pinned memory", lm, mb)
	}
}

// TestLayerMajorGradientsInPieces: a layer-major step of several
// micro-batches holds a layer's gradient sums in pinned memory; a gradient
// longer than a piece is held in pieces (a buffer each), so the gradient
// reservation is the pieces' buffers plus one piece's write-behind, not
// two whole-table power-of-two blocks (64 MiB for a 100k x 64 table's
// 24.4 MiB). A smaller zinf.piece_bytes lowers it (a little), and a pool
// below it is refused with advice that works: the micro-batch-major
// schedule.
func TestLayerMajorGradientsInPieces(t *testing.T) {
	const rows, dim = 100_000, 64
	model := zinf.LayeredModel(
		[]tensor.Desc{{Name: "emb", Shape: []int{rows, dim}}},
		[]tensor.Desc{{Name: "l1.w", Shape: []int{dim, dim}}},
	)
	cfgFor := func(dir string, piece int64) *config.Config {
		c := config.Default()
		c.SetScratchDir(dir)
		c.ZeroOptimization.OffloadParam.MaxInCPU = 0
		c.Zinf.Tiers.CPUPinnedBytes = 16 << 20 // below the minimum: no extra write-behinds
		c.Zinf.Bandwidth.Probe = false
		c.Zinf.Schedule = config.ScheduleLayerMajor
		c.GradientAccumulationSteps = 2
		c.ZeroOptimization.SubGroupSize = 65_536 // a small optimizer pipeline: the gradients weigh most
		c.Zinf.PieceBytes = config.Size(piece)
		return c
	}
	for _, piece := range []int64{4 << 20, 1 << 20} {
		t.Run(config.Size(piece).String(), func(t *testing.T) {
			p, err := zinf.PlanModel(context.Background(), cfgFor(filepath.Join(t.TempDir(), "nvme"), piece), model, zinf.Options{NoBandwidthProbe: true})
			if err != nil {
				t.Fatal(err)
			}
			res := p.Reservations
			g := res.GranuleBytes
			// The pool's buddy blocks: a power of two of granules.
			block := func(n int64) int64 {
				b := g
				for b < n {
					b *= 2
				}
				return b
			}
			pad := func(n int64) int64 { return (n + 4095) / 4096 * 4096 }
			pieceElems := piece / 4
			elems := int64(rows * dim)
			full, rest := elems/pieceElems, elems%pieceElems
			held := full*block(pad(4*pieceElems)) + block(pad(4*rest))
			want := held + block(pad(4*pieceElems)) // and one piece written behind
			if res.GradBytes != want || res.GradHeldLayer != 0 {
				t.Fatalf("gradient reservation %d (layer %d), want %d: %d pieces of %d elements and one of %d held, one written behind",
					res.GradBytes, res.GradHeldLayer, want, full, pieceElems, rest)
			}
			if whole := 2 * block(pad(4*elems)); res.GradBytes >= whole {
				t.Fatalf("gradient reservation %d, not below the two whole-table blocks %d", res.GradBytes, whole)
			}

			_, err = zinf.Open(cfgFor(t.TempDir(), piece), model, zinf.Options{NoBandwidthProbe: true, Logger: quietLog})
			var pe *zinf.PoolTooSmallError
			if !errors.As(err, &pe) {
				t.Fatalf("Open with a 16 MiB pool: %v, want a PoolTooSmallError", err)
			}
			msg := err.Error()
			if !strings.Contains(msg, "zinf.schedule micro-batch-major") || !strings.Contains(msg, "gradients of layer 0") || strings.Contains(msg, "lower zinf.piece_bytes") {
				t.Errorf("the refusal should name the layer-major hold and the schedule that avoids it: %v", err)
			}
		})
	}
}

// TestLayerMajorPiecedAtMinimumPool: a layer-major step of 3 micro-batches
// whose largest gradient is held in pieces trains in a pool of exactly
// the plan's minimum (the reservation counts the pieces' buffers), equal
// to the in-memory reference.
func TestLayerMajorPiecedAtMinimumPool(t *testing.T) {
	c := scheduleCase(t, "adam", 3, true)
	c.numel["l0.t0"] = 70_000 // 280 KB of gradient: five pieces of 64 KiB
	c.model = zinf.LayeredModel(
		[]tensor.Desc{{Name: "l0.t0", Shape: []int{70_000}}, {Name: "l0.t1", Shape: []int{61}}},
		[]tensor.Desc{{Name: "l1.t0", Shape: []int{1021}}, {Name: "l1.t1", Shape: []int{7}}},
	)
	c.cfg.Zinf.PieceBytes = 64 << 10
	probe := *c.cfg
	probe.GradientClipping = 0 // run sets the threshold
	p, err := zinf.PlanModel(context.Background(), &probe, c.model, zinf.Options{NoBandwidthProbe: true})
	if err != nil {
		t.Fatal(err)
	}
	if p.Reservations.GradHeldLayer != 0 {
		t.Fatalf("the gradient reservation is not the layer-major hold of layer 0: %+v", p.Reservations)
	}
	c.cfg.Zinf.Tiers.CPUPinnedBytes = config.Size(p.Reservations.MinPoolBytes)
	rts := c.run(t, 7, rand.New(rand.NewPCG(7, 1)))
	if !t.Failed() && rts[0].Schedule() != zinf.LayerMajor {
		t.Fatalf("schedule %s", rts[0].Schedule())
	}
}

// TestAccumulateGradPairRefusesLengths: a pair whose second gradient is
// not the tensor's length, or missing, or of an unknown tensor, is
// refused with the tensor's name and adds neither: after the refused
// pairs and one pair of every tensor, a step gives the bits of a
// runtime handed the same gradients one by one.
func TestAccumulateGradPairRefusesLengths(t *testing.T) {
	var rts [2]*zinf.Runtime
	var ctx context.Context
	var names []string
	for i := range rts {
		c := scheduleCase(t, "adam", 2, false)
		c.cfg.FP16, c.cfg.GradientClipping = false, 0
		var watch func(...*zinf.Runtime)
		ctx, watch = watchdog(t, time.Minute)
		rt, err := zinf.Open(c.cfg, c.model, zinf.Options{Logger: quietLog, NoBandwidthProbe: true})
		if err != nil {
			t.Fatal(err)
		}
		defer rt.Close()
		watch(rt)
		for _, d := range c.model.Tensors {
			if err := rt.Init(ctx, d.Name, make([]float32, c.numel[d.Name])); err != nil {
				t.Fatal(err)
			}
		}
		rts[i] = rt
		names = names[:0]
		for _, d := range c.model.Tensors {
			names = append(names, d.Name)
			n := c.numel[d.Name]
			a, b := make([]float32, n), make([]float32, n)
			for j := range a {
				a[j], b[j] = float32(j)*0.25+0.1, float32(n-j)*0.5+0.3
			}
			if i == 0 {
				for _, g := range [][]float32{a, b} {
					if err := rt.AccumulateGrad(ctx, d.Name, g); err != nil {
						t.Fatal(err)
					}
				}
				continue
			}
			for _, bad := range [][]float32{nil, make([]float32, n-1), make([]float32, n+1)} {
				err := rt.AccumulateGradPair(ctx, d.Name, a, bad)
				if err == nil || !strings.Contains(err.Error(), d.Name) {
					t.Fatalf("a pair with %d values for %d: %v (want an error naming %s)", len(bad), n, err, d.Name)
				}
			}
			if err := rt.AccumulateGradPair(ctx, "no.such", a, b); err == nil || !strings.Contains(err.Error(), "no.such") {
				t.Fatalf("an unknown tensor: %v", err)
			}
			if err := rt.AccumulateGradPair(ctx, d.Name, a, b); err != nil {
				t.Fatal(err)
			}
		}
	}
	for _, rt := range rts {
		if err := rt.Step(ctx); err != nil {
			t.Fatal(err)
		}
	}
	for _, name := range names {
		w0, m0, v0, err := rts[0].ReadOptimizerState(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		w1, m1, v1, err := rts[1].ReadOptimizerState(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		for j := range w0 {
			if math.Float32bits(w0[j]) != math.Float32bits(w1[j]) || math.Float32bits(m0[j]) != math.Float32bits(m1[j]) || math.Float32bits(v0[j]) != math.Float32bits(v1[j]) {
				t.Fatalf("%s[%d]: in pairs %v %v %v, one by one %v %v %v", name, j, w1[j], m1[j], v1[j], w0[j], m0[j], v0[j])
			}
		}
	}
}

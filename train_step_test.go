package zinf_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/zinfio/zinf"
	"github.com/zinfio/zinf/aio"
	"github.com/zinfio/zinf/comm"
	"github.com/zinfio/zinf/config"
	"github.com/zinfio/zinf/internal/test/faults"
	"github.com/zinfio/zinf/plan"
	"github.com/zinfio/zinf/schedule"
	"github.com/zinfio/zinf/swapper/optimizer"
	"github.com/zinfio/zinf/swapper/param"
	"github.com/zinfio/zinf/tensor"
)

// TestTrainStepDifferential trains random small models through the public
// API — every rank on its own goroutine with a comm.NewLocal world, at
// world 1 and 4 — with every optimizer (Adam, AdamW, SGD plain, with
// momentum and Nesterov, Adagrad, Lion), random LR schedules, gradient
// clipping thresholds
// that trigger on some steps and not on others, fp32, bf16 or fp16 (static
// or dynamic loss scale, with injected inf gradients that must skip the
// step), speculation always, never or auto, serial or overlapped steps,
// and ENOSPC injected into one rank's optimizer, parameter or gradient
// writes during a step (a speculative write-behind when the step
// speculates), after which the loop retries. Every step must report what
// an independent in-memory reference decided (learning rate, loss scale,
// gradient norm bits, clip coefficient, skip), every parameter read must
// equal the reference bit for bit, and the final fp32 masters and Adam
// moments too. The reference applies unscale, overflow check, clip and
// update in that order, summing the squared gradients as the runtimes do:
// per rank, its partition of each tensor in model order, then the ranks in
// order. ZINF_TEST_SEED reproduces one seed; ZINF_STRESS=1 runs many more.
func TestTrainStepDifferential(t *testing.T) {
	forSeeds(t, 8, 3, 80, func(t *testing.T, _ int, seed uint64) { trainStepRun(t, seed) })
}

// stepCase is one random configuration of TestTrainStepDifferential.
type stepCase struct {
	model       zinf.Model
	layers      [][]string
	numel       map[string]int
	world       int
	micro       int
	steps       int
	cfg         *config.Config
	serial      bool
	overflowAt  map[[2]int]string // (step, micro) -> tensor whose gradient gets an inf
	faultStep   int               // -1: none
	faultRank   int
	faultTarget string
	layerMajor  bool // the loop runs every micro-batch of a layer at once
	// ahead: layer-major, the backward pass begins layer l-1 halfway
	// through layer l's micro-batches (the GoMLX loop begins it under the
	// last one's compute), so two layers hold gradient sums at once.
	ahead bool
	// pairs: layer-major, the gradients go over two micro-batches at a
	// time (AccumulateGradPair), the last alone when k is odd.
	pairs bool
	// overlapped counts the steps Step returned from with their update
	// running on; recovered the ones whose update then failed and were
	// retried (zinf.overlap_update).
	overlapped, recovered *atomic.Int64
}

// setLayers gives c a layered model of 1-D tensors, layer l's tensor i
// named "l<l>.t<i>" with sizes[l][i] elements.
func (c *stepCase) setLayers(sizes [][]int) {
	c.numel, c.layers = map[string]int{}, nil
	var ls [][]tensor.Desc
	for l, row := range sizes {
		var ts []tensor.Desc
		var names []string
		for i, n := range row {
			name := fmt.Sprintf("l%d.t%d", l, i)
			ts = append(ts, tensor.Desc{Name: name, Shape: []int{n}})
			names = append(names, name)
			c.numel[name] = n
		}
		ls = append(ls, ts)
		c.layers = append(c.layers, names)
	}
	c.model = zinf.LayeredModel(ls...)
}

func randomStepCase(t *testing.T, rng *rand.Rand) *stepCase {
	c := &stepCase{overflowAt: map[[2]int]string{}, faultStep: -1, overlapped: new(atomic.Int64), recovered: new(atomic.Int64)}
	var sizes [][]int
	for range 1 + rng.IntN(3) {
		var row []int
		for range 1 + rng.IntN(3) {
			row = append(row, []int{1, 3, 7, 61, 509, 1021, 2039}[rng.IntN(7)])
		}
		sizes = append(sizes, row)
	}
	c.setLayers(sizes)
	c.world = []int{1, 4, 1, 4, 2, 3}[rng.IntN(6)]
	c.micro = 1 + rng.IntN(2)
	c.steps = 4 + rng.IntN(3)
	cfg := config.Default()
	cfg.SetScratchDir(t.TempDir())
	cfg.Zinf.Tiers.CPUPinnedBytes = 32 << 20
	cfg.ZeroOptimization.SubGroupSize = int64([]int{100, 1000, 1 << 20}[rng.IntN(3)])
	cfg.Zinf.PipelineDepth = rng.IntN(3)
	if rng.IntN(4) == 0 {
		cfg.ZeroOptimization.OffloadOptimizer.Device = config.OffloadCPU
	}
	cfg.Optimizer.WeightDecay = []float64{0, 0.01}[rng.IntN(2)]
	cfg.Optimizer.LR = 0.01
	switch rng.IntN(6) {
	case 0:
		cfg.Optimizer.Type = config.OptimizerAdam
	case 1:
		cfg.Optimizer.Type = config.OptimizerAdamW
	case 2:
		cfg.Optimizer.Type = config.OptimizerSGD
		switch rng.IntN(3) {
		case 1:
			cfg.Optimizer.Momentum, cfg.Optimizer.Dampening = 0.9, 0.1
		case 2:
			cfg.Optimizer.Momentum, cfg.Optimizer.Nesterov = 0.8, true
		}
	case 3:
		cfg.Optimizer.Type, cfg.Optimizer.Eps = config.OptimizerAdagrad, 1e-10
		cfg.Optimizer.LRDecay, cfg.Optimizer.InitialAccumulatorValue = []float64{0, 0.05}[rng.IntN(2)], []float64{0, 0.1}[rng.IntN(2)]
	default:
		cfg.Optimizer.Type, cfg.Optimizer.Betas = config.OptimizerLion, [2]float64{0.9, 0.99}
		cfg.Optimizer.LR = 1e-3
	}
	switch rng.IntN(3) {
	case 1:
		cfg.BF16 = true
	case 2:
		cfg.FP16 = true
		l := &cfg.LossScaling
		if rng.IntN(3) == 0 {
			l.LossScale = 1024 // static
		}
		l.InitialScalePower = 8 + rng.IntN(5)
		l.LossScaleWindow = 1 + rng.IntN(3)
		l.Hysteresis = 1 + rng.IntN(2)
		l.ConsecutiveHysteresis = rng.IntN(2) == 0
		l.MinLossScale = 1.0 / 1024
		for s := range c.steps {
			if rng.IntN(3) == 0 {
				c.overflowAt[[2]int{s, rng.IntN(c.micro)}] = c.model.Tensors[rng.IntN(len(c.model.Tensors))].Name
			}
		}
	}
	if rng.IntN(4) != 0 {
		cfg.GradientClipping = -1 // set from the gradients' norm below
	}
	s := &cfg.Scheduler
	switch rng.IntN(5) {
	case 1:
		s.Type, s.WarmupMinLR, s.WarmupMaxLR, s.WarmupNumSteps = config.SchedulerWarmupLR, 0, 0.02, 3
		s.WarmupType = []string{config.WarmupLog, config.WarmupLinear}[rng.IntN(2)]
	case 2:
		s.Type, s.WarmupMinLR, s.WarmupMaxLR, s.WarmupNumSteps, s.TotalNumSteps = config.SchedulerWarmupDecayLR, 0.001, 0.02, 2, 6
	case 3:
		s.Type, s.WarmupMinRatio, s.WarmupNumSteps, s.TotalNumSteps, s.CosMinRatio = config.SchedulerWarmupCosineLR, 0.1, 2, 6, 0.01
	case 4:
		s.Type, s.CycleMinLR, s.CycleMaxLR, s.CycleFirstStepSize, s.CycleSecondStepSize = config.SchedulerOneCycle, 0.001, 0.02, 2, 2
		s.CycleMomentum, s.CycleMinMom, s.CycleMaxMom = rng.IntN(2) == 0, 0.8, 0.9
		s.CycleFirstStairCount, s.CycleSecondStairCount = 0, 0
	}
	cfg.Zinf.Speculate = []config.SpeculateMode{config.SpeculateAuto, config.SpeculateAlways, config.SpeculateNever}[rng.IntN(3)]
	c.serial = rng.IntN(4) == 0
	if rng.IntN(3) != 0 {
		c.faultStep = 1 + rng.IntN(c.steps-1)
		c.faultRank = rng.IntN(c.world)
		c.faultTarget = []string{"/zinf-optim-", "/zinf-param-", "/zinf-grad-"}[rng.IntN(3)]
	}
	c.cfg = cfg
	// The order of the micro-batches: both give the reference's bits.
	if c.layerMajor = rng.IntN(2) == 0; c.layerMajor {
		cfg.Zinf.Schedule = config.ScheduleLayerMajor
		c.micro = 1 + rng.IntN(4)
	}
	cfg.GradientAccumulationSteps = c.micro
	// Step returns before the update commits, and the next forward reads
	// each layer as soon as it is published.
	cfg.Zinf.OverlapUpdate = rng.IntN(2) == 0
	c.ahead = c.layerMajor && rng.IntN(2) == 0
	c.pairs = c.layerMajor && rng.IntN(2) == 0
	return c
}

// stepGrad is the gradient of a tensor at (step, micro): the full tensor,
// already reduced over the ranks, before loss scaling.
func stepGrad(name string, step, micro int, dst []float32) {
	for i := range dst {
		dst[i] = float32(math.Cos(float64(i*7+step*13+micro*3+len(name)*5))) * 0.01
	}
}

// stepRef is the in-memory reference: the expected outcome of every step.
type stepRef struct {
	infos   []zinf.StepInfo        // per step
	compute []map[string][]float32 // per step: the parameters its forward pass reads
	master  map[string][]float32
	states  map[string][][]float32 // the optimizer's states, Hyper.StateNames order
	names   []string               // their names
}

// refSumSquares sums squares in float64, index order, one rounding per
// addition.
func refSumSquares(v []float32) float64 {
	var s float64
	for _, x := range v {
		d := float64(x)
		s += float64(d * d)
	}
	return s
}

// refScaler is DeepSpeed's DynamicLossScaler, written out again for the
// reference (factor 2).
type refScaler struct {
	scale                 float64
	dynamic               bool
	window, hyst, curHyst int
	consecutive           bool
	min                   float64
	iter, lastOverflow    int
}

func (s *refScaler) update(overflow bool) {
	if !s.dynamic {
		return
	}
	if overflow {
		if s.hyst == 1 || s.curHyst == 1 {
			s.scale = math.Max(s.scale/2, s.min)
		} else {
			s.curHyst--
		}
		s.lastOverflow = s.iter
	} else {
		if s.consecutive {
			s.curHyst = s.hyst
		}
		if st := s.iter - s.lastOverflow - 1; st > 0 && st%s.window == 0 {
			if !s.consecutive {
				s.curHyst = s.hyst
			}
			s.scale *= 2
		}
	}
	s.iter++
}

func quantizeTo(d tensor.DType, v []float32) []float32 { return quantize(d, v) }

// reference runs the case in memory.
func (c *stepCase) reference(t *testing.T) *stepRef {
	cfg := c.cfg
	sched, err := schedule.FromConfig(cfg, 0)
	if err != nil {
		t.Fatal(err)
	}
	dtype := plan.ParamDType(cfg)
	h := plan.Hyper(cfg)
	r := &stepRef{master: map[string][]float32{}, states: map[string][][]float32{}, names: h.StateNames()}
	for _, d := range c.model.Tensors {
		n := c.numel[d.Name]
		w := make([]float32, n)
		for i := range w {
			w[i] = float32(math.Sin(float64(i)*0.37+float64(len(d.Name)))) * 0.1
		}
		r.master[d.Name] = w
		for range h.StateCount() {
			st := make([]float32, n)
			if h.Rule == optimizer.RuleAdagrad {
				for i := range st {
					st[i] = h.InitialAccumulatorValue
				}
			}
			r.states[d.Name] = append(r.states[d.Name], st)
		}
	}
	sc := &refScaler{scale: 1}
	if cfg.FP16 {
		l := cfg.LossScaling
		sc = &refScaler{scale: l.LossScale, window: l.LossScaleWindow, hyst: l.Hysteresis, curHyst: l.Hysteresis,
			consecutive: l.ConsecutiveHysteresis, min: l.MinLossScale, lastOverflow: -1}
		if l.LossScale == 0 {
			sc.dynamic, sc.scale = true, math.Ldexp(1, l.InitialScalePower)
		}
	}
	applied := 0
	checks := cfg.GradientClipping > 0 || cfg.FP16
	for step := range c.steps {
		comp := map[string][]float32{}
		for n, w := range r.master {
			comp[n] = quantizeTo(dtype, w)
		}
		r.compute = append(r.compute, comp)
		S := float32(sc.scale)
		acc := map[string][]float32{}
		for m := range c.micro {
			for _, d := range c.model.Tensors {
				g := c.grad(d.Name, step, m, S)
				if a, ok := acc[d.Name]; ok {
					for i := range a {
						a[i] += g[i]
					}
				} else {
					acc[d.Name] = g
				}
			}
		}
		info := zinf.StepInfo{LossScale: sc.scale, GradNorm: math.NaN(), ClipCoef: 1}
		f := float32(1)
		overflow := false
		if checks {
			var global float64
			for rank := range c.world {
				var local float64
				for _, d := range c.model.Tensors {
					lo, hi := param.Partition(c.numel[d.Name], rank, c.world)
					local += refSumSquares(acc[d.Name][lo:hi])
				}
				if rank == 0 {
					global = local
				} else {
					global += local
				}
			}
			norm := math.Sqrt(global) / sc.scale
			info.GradNorm = norm
			overflow = cfg.FP16 && (math.IsInf(global, 0) || math.IsNaN(global))
			k := sc.scale
			if c := cfg.GradientClipping; c > 0 && !overflow {
				if q := (norm + 1e-6) / c; q > 1 {
					k = q * sc.scale
					info.ClipCoef, info.Clipped = 1/q, true
				}
			}
			f = float32(1 / k)
		}
		if overflow {
			sc.update(true)
			info.Step = applied + 1
			if v := sched.At(applied + 1); true {
				info.LR = v.LR
				if v.Betas {
					info.Beta1, info.Beta2 = v.Beta1, v.Beta2
				}
			}
			info.NextLossScale = sc.scale
			r.infos = append(r.infos, info)
			continue
		}
		applied++
		v := sched.At(applied)
		p := optimizer.StepParams{LR: float32(v.LR), LR64: v.LR}
		if v.Betas {
			p.Beta1, p.Beta2 = float32(v.Beta1), float32(v.Beta2)
			info.Beta1, info.Beta2 = v.Beta1, v.Beta2
		}
		for _, d := range c.model.Tensors {
			g := acc[d.Name]
			if f != 1 {
				for i := range g {
					g[i] *= f
				}
			}
			optimizer.Update(r.master[d.Name], g, r.states[d.Name], applied, h, p)
		}
		if cfg.FP16 {
			sc.update(false)
		}
		info.Step, info.Applied, info.LR, info.NextLossScale = applied, true, v.LR, sc.scale
		r.infos = append(r.infos, info)
	}
	return r
}

// grad is what the loop hands to AccumulateGrad: the gradient times the
// loss scale, with an inf where the case overflows.
func (c *stepCase) grad(name string, step, micro int, scale float32) []float32 {
	g := make([]float32, c.numel[name])
	stepGrad(name, step, micro, g)
	if scale != 1 {
		for i := range g {
			g[i] *= scale
		}
	}
	if c.overflowAt[[2]int{step, micro}] == name {
		g[len(g)/2] = float32(math.Inf(1))
	}
	return g
}

func trainStepRun(t *testing.T, seed uint64) {
	rng := rand.New(rand.NewPCG(seed, 0xc11b))
	c := randomStepCase(t, rng)
	c.run(t, seed, rng)
}

// run trains the case on c.world runtimes and checks every step, every
// read and the final state against the in-memory reference.
func (c *stepCase) run(t *testing.T, seed uint64, rng *rand.Rand) []*zinf.Runtime {
	cfg := c.cfg
	if cfg.GradientClipping < 0 {
		// A threshold near the first step's norm: clipping triggers on
		// some steps and not on others.
		probe := *c
		probeCfg := *cfg
		probeCfg.GradientClipping = 1e30
		probe.cfg = &probeCfg
		norm := probe.reference(t).infos[0].GradNorm
		if math.IsNaN(norm) || math.IsInf(norm, 0) || norm == 0 {
			norm = 0.05
		}
		cfg.GradientClipping = norm * (0.9 + 0.2*rng.Float64())
	}
	if err := cfg.Validate(); err != nil {
		t.Fatalf("config: %v", err)
	}
	ref := c.reference(t)
	t.Logf("layers %v, sizes %v, optimizer offload %s, sub-group %d, pipeline %d", c.layers, c.numel, cfg.ZeroOptimization.OffloadOptimizer.Device,
		cfg.ZeroOptimization.SubGroupSize, cfg.Zinf.PipelineDepth)
	t.Logf("optimizer %s %+v", cfg.Optimizer.Type, plan.Hyper(cfg))
	t.Logf("overlap update %v, the next layer begun ahead %v, gradients in pairs %v", cfg.Zinf.OverlapUpdate, c.ahead, c.pairs)
	t.Logf("layer-major %v, world %d, micro %d, steps %d, tensors %d, dtype %s, clip %v, loss scale %+v, scheduler %s, speculate %s, serial %v, overflows %v, fault step %d rank %d %s",
		c.layerMajor, c.world, c.micro, c.steps, len(c.model.Tensors), plan.ParamDType(cfg), cfg.GradientClipping, cfg.LossScaling, cfg.Scheduler.Type,
		cfg.Zinf.Speculate, c.serial, c.overflowAt, c.faultStep, c.faultRank, c.faultTarget)

	ctx, watch := watchdog(t, 2*time.Minute)
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	comms, err := comm.NewLocal(c.world, comm.LocalOptions{StallTimeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	rts := make([]*zinf.Runtime, c.world)
	injs := make([]*faults.Injector, c.world)
	for r := range c.world {
		injs[r] = faults.New(seed + uint64(r))
		rt, err := zinf.Open(cfg, c.model, zinf.Options{Logger: quiet, Rank: r, WorldSize: c.world, Comm: comms[r], Faults: injs[r], SerialStep: c.serial})
		if err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
		t.Cleanup(func() { rt.Close() })
		rts[r] = rt
	}
	watch(rts...)
	for _, d := range c.model.Tensors {
		for r, rt := range rts {
			if err := rt.Init(ctx, d.Name, ref.compute0(c, d.Name)); err != nil {
				t.Fatalf("rank %d: init %s: %v", r, d.Name, err)
			}
		}
	}
	errs := make([]error, c.world)
	var wg sync.WaitGroup
	for r, rt := range rts {
		wg.Go(func() {
			errs[r] = c.rankLoop(ctx, rt, injs[r], ref)
			if errs[r] != nil {
				comms[r].Abort(errs[r]) // the others stop waiting for this rank
			}
		})
	}
	wg.Wait()
	for r, err := range errs {
		if err != nil {
			t.Errorf("rank %d: %v", r, err)
		}
	}
	if t.Failed() {
		return rts
	}
	for _, d := range c.model.Tensors {
		for r, rt := range rts {
			lo, hi := rt.Partition(d.Name)
			if lo == hi {
				continue
			}
			ms, st, err := rt.ReadOptimizerStates(ctx, d.Name)
			if err != nil {
				t.Fatalf("rank %d: read state %s: %v", r, d.Name, err)
			}
			if len(st) != len(ref.names) {
				t.Fatalf("rank %d %s: %d optimizer states, reference %d (%v)", r, d.Name, len(st), len(ref.names), ref.names)
			}
			type pair struct {
				what      string
				got, want []float32
			}
			pairs := []pair{{"master", ms, ref.master[d.Name][lo:hi]}}
			for k, name := range ref.names {
				pairs = append(pairs, pair{name, st[k], ref.states[d.Name][k][lo:hi]})
			}
			for _, x := range pairs {
				for i := range x.want {
					if math.Float32bits(x.got[i]) != math.Float32bits(x.want[i]) {
						t.Fatalf("rank %d %s.%s[%d] = %v, reference %v", r, d.Name, x.what, lo+i, x.got[i], x.want[i])
					}
				}
			}
		}
	}
	// Speculation counts: every speculated step was committed or rolled
	// back, and a step that needed a correction never committed.
	for r, rt := range rts {
		tr := rt.Metrics().Train
		if tr.Commits+tr.Rollbacks != tr.Speculated || tr.Applied+tr.Skipped != c.steps {
			t.Errorf("rank %d: train stats %+v for %d steps", r, tr, c.steps)
		}
		if cfg.Zinf.Speculate == config.SpeculateNever && tr.Speculated != 0 {
			t.Errorf("rank %d: speculate never, but %d steps speculated", r, tr.Speculated)
		}
	}
	hits := 0
	for _, in := range injs {
		hits += in.Hits()
	}
	t.Logf("rank 0: %+v; faults fired: %d; steps overlapped %d, recovered after Step returned %d", rts[0].Metrics().Train, hits, c.overlapped.Load(), c.recovered.Load())
	return rts
}

// checkReads reads layer l's parameters (begun) and compares this rank's
// partition with the reference's step.
func (c *stepCase) checkReads(ctx context.Context, rt *zinf.Runtime, ref *stepRef, step, l int) error {
	for _, n := range c.layers[l] {
		got := make([]float32, c.numel[n])
		if err := rt.ReadParam(ctx, n, got); err != nil {
			return err
		}
		lo, hi := rt.Partition(n) // a rank reads its partition
		for i := lo; i < hi; i++ {
			if w := ref.compute[step][n][i]; math.Float32bits(got[i]) != math.Float32bits(w) {
				return fmt.Errorf("step %d: %s[%d] = %v, reference %v", step, n, i, got[i], w)
			}
		}
	}
	return nil
}

// layerMajorStep runs a step's forward and backward passes layer-major:
// every micro-batch of a layer while it is begun (BeginLayerMicroBatches),
// each gradient handed once per micro-batch, in micro-batch order.
func (c *stepCase) layerMajorStep(ctx context.Context, rt *zinf.Runtime, ref *stepRef, step int, S float32, retry func(string, func() error) error) error {
	rt.Forward()
	for l := range c.layers {
		if err := rt.BeginLayerMicroBatches(ctx, l, c.micro); err != nil {
			return fmt.Errorf("step %d forward layer %d: %w", step, l, err)
		}
		if err := c.checkReads(ctx, rt, ref, step, l); err != nil {
			return err
		}
		rt.EndLayer(l)
	}
	rt.Backward()
	ahead := -1 // the layer begun before the last micro-batch of the one after it
	for l := len(c.layers) - 1; l >= 0; l-- {
		if ahead != l {
			if err := rt.BeginLayerMicroBatches(ctx, l, c.micro); err != nil {
				return fmt.Errorf("step %d backward layer %d: %w", step, l, err)
			}
		}
		ahead = -1
		step1 := 1
		if c.pairs {
			step1 = 2
		}
		for m := 0; m < c.micro; m += step1 {
			if c.ahead && m <= c.micro/2 && c.micro/2 < m+step1 && l > 0 {
				if err := rt.BeginLayerMicroBatches(ctx, l-1, c.micro); err != nil {
					return fmt.Errorf("step %d backward layer %d (begun under layer %d): %w", step, l-1, l, err)
				}
				ahead = l - 1
			}
			for _, n := range c.layers[l] {
				g := c.grad(n, step, m, S)
				if m+1 < c.micro && c.pairs {
					g2 := c.grad(n, step, m+1, S)
					if err := retry("accumulate a pair "+n, func() error { return rt.AccumulateGradPair(ctx, n, g, g2) }); err != nil {
						return err
					}
					continue
				}
				if err := retry("accumulate "+n, func() error { return rt.AccumulateGrad(ctx, n, g) }); err != nil {
					return err
				}
			}
		}
		_ = rt.StepLayer(ctx, l) // a failure here is returned by Step too
		rt.EndLayer(l)
	}
	return nil
}

// compute0 is a tensor's initial master.
func (r *stepRef) compute0(c *stepCase, name string) []float32 {
	w := make([]float32, c.numel[name])
	for i := range w {
		w[i] = float32(math.Sin(float64(i)*0.37+float64(len(name)))) * 0.1
	}
	return w
}

// rankLoop is one rank's training loop, the way the README writes it,
// checking every read and every step against the reference.
func (c *stepCase) rankLoop(ctx context.Context, rt *zinf.Runtime, inj *faults.Injector, ref *stepRef) error {
	cfg := c.cfg
	retries := 0
	retry := func(what string, op func() error) error {
		for attempt := 0; ; attempt++ {
			err := op()
			if err == nil {
				return nil
			}
			retries++
			if errors.Is(err, zinf.ErrUpdateFailed) {
				return err // the last step failed after Step returned: the caller retries it
			}
			if attempt >= 20 || !(errors.Is(err, aio.ErrNoSpace) || errors.Is(err, zinf.ErrRankFailed)) {
				return fmt.Errorf("%s: %w", what, err)
			}
			inj.Clear() // space returns
		}
	}
	// recover retries a step whose update failed after Step returned
	// (zinf.overlap_update), as ErrUpdateFailed's doc says: space
	// returns, Step again, and the same outcome as the reference's.
	recoverStep := func(step int, cause error) error {
		if !errors.Is(cause, zinf.ErrUpdateFailed) || inj.Hits() == 0 || !errors.Is(cause, aio.ErrNoSpace) {
			return cause
		}
		if !cfg.Zinf.OverlapUpdate {
			return fmt.Errorf("ErrUpdateFailed without zinf.overlap_update: %w", cause)
		}
		inj.Clear()
		retries++
		c.recovered.Add(1)
		if err := retry(fmt.Sprintf("step %d again", step), func() error { return rt.Step(ctx) }); err != nil {
			return err
		}
		if got, want := rt.LastStep(), ref.infos[step]; got.Step != want.Step || got.Applied != want.Applied || got.NextLossScale != want.NextLossScale {
			return fmt.Errorf("step %d retried:\n got %+v\nwant %+v", step, got, want)
		}
		return nil
	}
	for step := 0; step < c.steps; step++ {
		if step == c.faultStep && rt.Rank == c.faultRank {
			inj.Add(faults.Rule{Kind: faults.Writes, PathContains: c.faultTarget, Err: syscall.ENOSPC, Times: 2})
		}
		err := c.rankStep(ctx, rt, ref, step, retry, &retries)
		if err != nil && step > 0 && errors.Is(err, zinf.ErrUpdateFailed) {
			// The last step's update failed under this one's forward or
			// backward: retry it, then run this step again from the start.
			if err = recoverStep(step-1, err); err == nil {
				err = c.rankStep(ctx, rt, ref, step, retry, &retries)
			}
		}
		if err != nil {
			return err
		}
	}
	// The last step's update may still be running, and may fail.
	if err := rt.WaitStep(ctx); err != nil {
		return recoverStep(c.steps-1, err)
	}
	return nil
}

// rankStep is one step of rankLoop: its micro-batches and Step, checked
// against the reference.
func (c *stepCase) rankStep(ctx context.Context, rt *zinf.Runtime, ref *stepRef, step int, retry func(string, func() error) error, retriesp *int) error {
	cfg := c.cfg
	overlap := rt.Placement().OverlapStep && !c.serial
	checks := cfg.GradientClipping > 0 || cfg.FP16
	{
		want := ref.infos[step]
		retriesBefore := *retriesp
		if s := rt.LossScale(); s != want.LossScale {
			return fmt.Errorf("step %d: loss scale %v, reference %v", step, s, want.LossScale)
		}
		S := float32(rt.LossScale())
		if c.layerMajor {
			if err := c.layerMajorStep(ctx, rt, ref, step, S, retry); err != nil {
				return err
			}
		}
		for m := range c.micro {
			if c.layerMajor {
				break
			}
			rt.Forward()
			for l := range c.layers {
				if err := rt.BeginLayer(ctx, l); err != nil {
					return fmt.Errorf("step %d forward layer %d: %w", step, l, err)
				}
				if err := c.checkReads(ctx, rt, ref, step, l); err != nil {
					return err
				}
				rt.EndLayer(l)
			}
			rt.Backward()
			for l := len(c.layers) - 1; l >= 0; l-- {
				if err := rt.BeginLayer(ctx, l); err != nil {
					return fmt.Errorf("step %d backward layer %d: %w", step, l, err)
				}
				for _, n := range c.layers[l] {
					g := c.grad(n, step, m, S)
					if err := retry("accumulate "+n, func() error { return rt.AccumulateGrad(ctx, n, g) }); err != nil {
						return err
					}
				}
				if m == c.micro-1 {
					// A failure here is returned by Step too.
					_ = rt.StepLayer(ctx, l)
				}
				rt.EndLayer(l)
			}
		}
		speculatedBefore := rt.Metrics().Train.Speculated
		if err := retry(fmt.Sprintf("step %d", step), func() error { return rt.Step(ctx) }); err != nil {
			return err
		}
		got := rt.LastStep()
		if got.Overlapped {
			c.overlapped.Add(1)
			if !cfg.Zinf.OverlapUpdate {
				return fmt.Errorf("step %d: overlapped without zinf.overlap_update", step)
			}
		}
		same := got.Step == want.Step && got.Applied == want.Applied && got.Clipped == want.Clipped &&
			math.Float64bits(got.LR) == math.Float64bits(want.LR) && got.Beta1 == want.Beta1 && got.Beta2 == want.Beta2 &&
			got.LossScale == want.LossScale && got.NextLossScale == want.NextLossScale &&
			math.Float64bits(got.ClipCoef) == math.Float64bits(want.ClipCoef) &&
			(math.Float64bits(got.GradNorm) == math.Float64bits(want.GradNorm) || math.IsNaN(got.GradNorm) && math.IsNaN(want.GradNorm))
		if !same {
			return fmt.Errorf("step %d:\n got %+v\nwant %+v", step, got, want)
		}
		// With speculation forced on and room to overlap, a step that was
		// not retried (a fault, which may fire in a later step than the
		// one it was set at) speculated, and rolled back exactly when it
		// needed a correction (clipped or skipped).
		spec := rt.Metrics().Train.Speculated > speculatedBefore
		if checks && overlap && cfg.Zinf.Speculate == config.SpeculateAlways && *retriesp == retriesBefore {
			if !spec || !got.Speculated {
				return fmt.Errorf("step %d did not speculate (speculate always, overlap on): %+v", step, got)
			}
			if got.RolledBack != (got.Clipped || !got.Applied) {
				return fmt.Errorf("step %d: rolled back %v, clipped %v, applied %v", step, got.RolledBack, got.Clipped, got.Applied)
			}
		}
	}
	return nil
}

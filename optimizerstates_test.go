package zinf_test

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"path/filepath"
	"strings"
	"testing"

	"github.com/zinfio/zinf"
	"github.com/zinfio/zinf/checkpoint"
	"github.com/zinfio/zinf/config"
	"github.com/zinfio/zinf/plan"
	"github.com/zinfio/zinf/swapper/optimizer"
	"github.com/zinfio/zinf/tensor"
)

// TestOptimizerStates8BitEqualsInMemory trains a small model through the
// public API with zinf.optimizer_states "8bit" — the optimizer on NVMe
// or in pinned memory, one micro-batch or eight (layer-major and
// micro-batch-major), gradient clipping that triggers on some steps —
// and holds every parameter the forward passes read, the final masters
// and the decoded moments to an in-memory reference bit for bit: the
// micro-batches' gradients summed in float32 in order, the global norm's
// clip factor (DeepSpeed's), then optimizer.Adam8Step on whole tensors,
// or AdamStep on fp32 moments for the tensors that keep them (under 4096
// elements, or matched by zinf.optimizer_states_fp32).
func TestOptimizerStates8BitEqualsInMemory(t *testing.T) {
	type tc struct {
		micro    int
		schedule config.ScheduleMode
		device   config.OffloadDevice
	}
	var cases []tc
	for _, dev := range []config.OffloadDevice{config.OffloadNVMe, config.OffloadCPU} {
		cases = append(cases, tc{1, config.ScheduleMicroBatchMajor, dev}, tc{8, config.ScheduleLayerMajor, dev}, tc{8, config.ScheduleMicroBatchMajor, dev})
	}
	for _, c := range cases {
		t.Run(fmt.Sprintf("k=%d/%s/optimizer=%s", c.micro, c.schedule, c.device), func(t *testing.T) {
			cfg := config.Default()
			cfg.SetScratchDir(t.TempDir())
			cfg.Zinf.Tiers.CPUPinnedBytes = 32 << 20
			cfg.ZeroOptimization.OffloadParam.MaxInCPU = 0
			cfg.ZeroOptimization.OffloadOptimizer.Device = c.device
			cfg.ZeroOptimization.SubGroupSize = 600 // rounded down to 512: sub-groups of two blocks
			cfg.Zinf.OptimizerStates = config.OptimizerStates8Bit
			cfg.Zinf.Schedule = c.schedule
			cfg.GradientAccumulationSteps = c.micro
			cfg.GradientClipping = 0.25 // the norms are 0.09 to 1.5: some steps clip, some do not
			cfg.Optimizer.LR = 0.01
			cfg.Zinf.OptimizerStatesFP32 = []string{"*embed*"}
			model := zinf.LayeredModel(stateLayers()...)
			rt, err := zinf.Open(cfg, model, zinf.Options{})
			if err != nil {
				t.Fatal(err)
			}
			defer rt.Close()
			if got := string(rt.Schedule()); got != string(c.schedule) {
				t.Fatalf("schedule %s, want %s", got, c.schedule)
			}
			ctx := context.Background()
			ref := newRef8(model)
			for _, d := range model.Tensors {
				if err := rt.Init(ctx, d.Name, ref.p[d.Name]); err != nil {
					t.Fatal(err)
				}
			}
			h := plan.Hyper(cfg)
			clipped := 0
			const steps = 5
			for step := 1; step <= steps; step++ {
				grad := func(name string, micro int) []float32 {
					g := make([]float32, len(ref.p[name]))
					amp := 0.002 * float64(1+(step%3)*4)
					for i := range g {
						g[i] = float32(math.Cos(float64(i*7+step*13+micro*3+len(name)*5)) * amp)
					}
					return g
				}
				read := func(l int) {
					for _, name := range rt.LayerTensors(l) {
						w := make([]float32, len(ref.p[name]))
						if err := rt.ReadParam(ctx, name, w); err != nil {
							t.Fatal(err)
						}
						if i := diffAt(w, ref.p[name]); i >= 0 {
							t.Fatalf("step %d: %s read %#x at %d, reference %#x", step, name, math.Float32bits(w[i]), i, math.Float32bits(ref.p[name][i]))
						}
					}
				}
				if c.schedule == config.ScheduleLayerMajor {
					rt.Forward()
					for l := range rt.Layers() {
						if err := rt.BeginLayerMicroBatches(ctx, l, c.micro); err != nil {
							t.Fatal(err)
						}
						read(l)
						rt.EndLayer(l)
					}
					rt.Backward()
					for l := rt.Layers() - 1; l >= 0; l-- {
						if err := rt.BeginLayerMicroBatches(ctx, l, c.micro); err != nil {
							t.Fatal(err)
						}
						for m := range c.micro {
							for _, name := range rt.LayerTensors(l) {
								if err := rt.AccumulateGrad(ctx, name, grad(name, m)); err != nil {
									t.Fatal(err)
								}
							}
						}
						_ = rt.StepLayer(ctx, l) // a failure is returned by Step too
						rt.EndLayer(l)
					}
				} else {
					for m := range c.micro {
						rt.Forward()
						for l := range rt.Layers() {
							if err := rt.BeginLayer(ctx, l); err != nil {
								t.Fatal(err)
							}
							read(l)
							rt.EndLayer(l)
						}
						rt.Backward()
						for l := rt.Layers() - 1; l >= 0; l-- {
							if err := rt.BeginLayer(ctx, l); err != nil {
								t.Fatal(err)
							}
							for _, name := range rt.LayerTensors(l) {
								if err := rt.AccumulateGrad(ctx, name, grad(name, m)); err != nil {
									t.Fatal(err)
								}
							}
							if m == c.micro-1 {
								_ = rt.StepLayer(ctx, l)
							}
							rt.EndLayer(l)
						}
					}
				}
				if err := rt.Step(ctx); err != nil {
					t.Fatalf("step %d: %v", step, err)
				}
				// The reference: sum, clip, Adam8Step.
				acc := map[string][]float32{}
				var sum float64
				for _, d := range model.Tensors {
					a := make([]float32, len(ref.p[d.Name]))
					for m := range c.micro {
						for i, x := range grad(d.Name, m) {
							a[i] += x
						}
					}
					acc[d.Name] = a
					sum += optimizer.SumSquares(a)
				}
				f, _, coef := optimizer.GradFactor(sum, 1, cfg.GradientClipping)
				info := rt.LastStep()
				if info.Clipped != (coef < 1) || math.Float64bits(info.ClipCoef) != math.Float64bits(coef) {
					t.Fatalf("step %d: clipped %v coef %v, reference coef %v", step, info.Clipped, info.ClipCoef, coef)
				}
				if info.Clipped {
					clipped++
				}
				p := optimizer.StepParams{LR: float32(cfg.Optimizer.LR), LR64: cfg.Optimizer.LR, ScaleGrads: f != 1, GradScale: f}
				for _, d := range model.Tensors {
					ref.step(d.Name, acc[d.Name], step, h, p)
				}
			}
			if clipped == 0 || clipped == steps {
				t.Errorf("clipping triggered on %d of %d steps: the test wants both kinds", clipped, steps)
			}
			if err := rt.WaitStep(ctx); err != nil {
				t.Fatal(err)
			}
			for _, d := range model.Tensors {
				n := d.Name
				master, m, v, err := rt.ReadOptimizerState(ctx, n)
				if err != nil {
					t.Fatal(err)
				}
				wm, wv := ref.moments(n)
				if f, _ := rt.Optimizer.StateFormatOf(n); f != ref.format(n) {
					t.Errorf("%s: states %v, want %v", n, f, ref.format(n))
				}
				for _, x := range []struct {
					what      string
					got, want []float32
				}{{"master", master, ref.p[n]}, {"exp_avg", m, wm}, {"exp_avg_sq", v, wv}} {
					if i := diffAt(x.got, x.want); i >= 0 {
						t.Fatalf("%s %s differs at %d: %#x, reference %#x", n, x.what, i, math.Float32bits(x.got[i]), math.Float32bits(x.want[i]))
					}
				}
			}
		})
	}
}

// stateLayers is the model of the optimizer-states tests: tensors of
// 8-bit states (4096 elements or more) beside one too small for them and
// one kept in fp32 by name ("*embed*").
func stateLayers() [][]tensor.Desc {
	return [][]tensor.Desc{
		{{Name: "l0.w", Shape: []int{5000}}, {Name: "l0.b", Shape: []int{3}}},
		{{Name: "l1.w", Shape: []int{4400}}, {Name: "l1.embed", Shape: []int{4200}}},
	}
}

// ref8 is the in-memory reference of Adam over 8-bit moments, and over
// fp32 moments for the tensors that keep them.
type ref8 struct {
	p      map[string][]float32
	qm, qv map[string][]uint8
	am, av map[string][]float32
	m, v   map[string][]float32 // fp32 moments
}

// format is the states' format of tensor n under the planner's rule
// (fp32 under 4096 elements or named *embed*).
func (r *ref8) format(n string) optimizer.StateFormat {
	if len(r.p[n]) < optimizer.MinCompressedElems || strings.Contains(n, "embed") {
		return optimizer.FormatFP32
	}
	return optimizer.FormatBlockwise8
}

// step applies one step of n's rule.
func (r *ref8) step(n string, g []float32, step int, h optimizer.Hyper, p optimizer.StepParams) {
	if r.format(n) == optimizer.FormatFP32 {
		optimizer.AdamStep(r.p[n], g, r.m[n], r.v[n], step, h, p)
		return
	}
	optimizer.Adam8Step(r.p[n], g, r.qm[n], r.qv[n], r.am[n], r.av[n], step, h, p)
}

// moments returns n's moments as fp32.
func (r *ref8) moments(n string) (m, v []float32) {
	if r.format(n) == optimizer.FormatFP32 {
		return r.m[n], r.v[n]
	}
	m, v = make([]float32, len(r.p[n])), make([]float32, len(r.p[n]))
	optimizer.SignedDynamicMap().Dequantize(m, r.qm[n], r.am[n])
	optimizer.UnsignedDynamicMap().Dequantize(v, r.qv[n], r.av[n])
	return m, v
}

func newRef8(model zinf.Model) *ref8 {
	r := &ref8{p: map[string][]float32{}, qm: map[string][]uint8{}, qv: map[string][]uint8{}, am: map[string][]float32{}, av: map[string][]float32{},
		m: map[string][]float32{}, v: map[string][]float32{}}
	for _, d := range model.Tensors {
		n, _ := d.Numel()
		w := make([]float32, n)
		for i := range w {
			w[i] = float32(math.Sin(float64(i)*0.37+float64(len(d.Name)))) * 0.1
		}
		blocks := optimizer.FormatBlockwise8.Blocks(int64(n))
		r.p[d.Name] = w
		r.m[d.Name], r.v[d.Name] = make([]float32, n), make([]float32, n)
		r.qm[d.Name], r.qv[d.Name] = make([]uint8, n), make([]uint8, n)
		r.am[d.Name], r.av[d.Name] = make([]float32, blocks), make([]float32, blocks)
		zeros := make([]float32, n)
		optimizer.SignedDynamicMap().Quantize(r.qm[d.Name], r.am[d.Name], zeros)
		optimizer.UnsignedDynamicMap().Quantize(r.qv[d.Name], r.av[d.Name], zeros)
	}
	return r
}

// diffAt is the first index where a and b differ in bits (or length), or
// -1.
func diffAt(a, b []float32) int {
	for i := range max(len(a), len(b)) {
		if i >= len(a) || i >= len(b) || math.Float32bits(a[i]) != math.Float32bits(b[i]) {
			return i
		}
	}
	return -1
}

// TestOptimizerStates8BitCheckpointResume: a run with 8-bit optimizer
// states (on NVMe or in pinned memory) saves a checkpoint after 3 steps
// and goes on for 3 more; a fresh run of the same config that loads the
// checkpoint and takes the same 3 steps ends with the same masters and
// the same codes and absmax bit for bit (the checkpoint keeps the states
// as stored: U8 codes with their absmax). Loading the checkpoint into an
// fp32 run decodes the states, exactly the 8-bit run's decoded states,
// and says so in the log.
func TestOptimizerStates8BitCheckpointResume(t *testing.T) {
	for _, dev := range []config.OffloadDevice{config.OffloadNVMe, config.OffloadCPU} {
		t.Run("optimizer="+string(dev), func(t *testing.T) {
			ctx := context.Background()
			model := zinf.LayeredModel(stateLayers()...)
			numel := map[string]int{}
			for _, d := range model.Tensors {
				n, _ := d.Numel()
				numel[d.Name] = int(n)
			}
			open := func(states config.OptimizerStates, log *slog.Logger) *zinf.Runtime {
				cfg := config.Default()
				cfg.SetScratchDir(t.TempDir())
				cfg.Zinf.Tiers.CPUPinnedBytes = 32 << 20
				cfg.ZeroOptimization.OffloadOptimizer.Device = dev
				cfg.ZeroOptimization.SubGroupSize = 512
				cfg.Zinf.OptimizerStates = states
				cfg.Zinf.OptimizerStatesFP32 = []string{"*embed*"}
				cfg.GradientClipping = 0.1
				cfg.Optimizer.LR = 0.01
				rt, err := zinf.Open(cfg, model, zinf.Options{Logger: log})
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { rt.Close() })
				for _, d := range model.Tensors {
					if err := rt.Init(ctx, d.Name, make([]float32, numel[d.Name])); err != nil {
						t.Fatal(err)
					}
				}
				return rt
			}
			train := func(rt *zinf.Runtime, from, to int) {
				for step := from; step <= to; step++ {
					rt.Forward()
					for l := range rt.Layers() {
						if err := rt.BeginLayer(ctx, l); err != nil {
							t.Fatal(err)
						}
						rt.EndLayer(l)
					}
					rt.Backward()
					for l := rt.Layers() - 1; l >= 0; l-- {
						if err := rt.BeginLayer(ctx, l); err != nil {
							t.Fatal(err)
						}
						for _, name := range rt.LayerTensors(l) {
							g := make([]float32, numel[name])
							for i := range g {
								g[i] = float32(math.Cos(float64(i*7+step*13+len(name)*5)) * 0.002 * float64(1+(step%3)*4))
							}
							if err := rt.AccumulateGrad(ctx, name, g); err != nil {
								t.Fatal(err)
							}
						}
						_ = rt.StepLayer(ctx, l)
						rt.EndLayer(l)
					}
					if err := rt.Step(ctx); err != nil {
						t.Fatalf("step %d: %v", step, err)
					}
				}
			}
			a := open(config.OptimizerStates8Bit, nil)
			train(a, 1, 3)
			dir := filepath.Join(t.TempDir(), "step-000003")
			if _, err := zinf.SaveCheckpoint(ctx, dir, []*zinf.Runtime{a}, zinf.CheckpointMeta{Step: 3}, checkpoint.SaveOptions{}); err != nil {
				t.Fatal(err)
			}
			saved := map[string][3][]float32{}
			for _, d := range model.Tensors {
				m, ea, eas, err := a.ReadOptimizerState(ctx, d.Name)
				if err != nil {
					t.Fatal(err)
				}
				saved[d.Name] = [3][]float32{m, ea, eas}
			}
			train(a, 4, 6)

			b := open(config.OptimizerStates8Bit, nil)
			if _, err := zinf.LoadCheckpoint(ctx, dir, []*zinf.Runtime{b}); err != nil {
				t.Fatal(err)
			}
			train(b, 4, 6)
			for _, d := range model.Tensors {
				ma, sa, err := a.Optimizer.ReadEncodedStates(ctx, d.Name)
				if err != nil {
					t.Fatal(err)
				}
				mb, sb, err := b.Optimizer.ReadEncodedStates(ctx, d.Name)
				if err != nil {
					t.Fatal(err)
				}
				if i := diffAt(ma, mb); i >= 0 {
					t.Fatalf("%s: resumed master differs at %d", d.Name, i)
				}
				for k := range sa {
					if string(sa[k].Data) != string(sb[k].Data) || diffAt(sa[k].Absmax, sb[k].Absmax) >= 0 {
						t.Fatalf("%s: resumed state %d (codes, absmax) differs", d.Name, k)
					}
				}
			}

			var logged strings.Builder
			c := open(config.OptimizerStatesFP32, slog.New(slog.NewTextHandler(&logged, nil)))
			if _, err := zinf.LoadCheckpoint(ctx, dir, []*zinf.Runtime{c}); err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(logged.String(), "optimizer states converted") || !strings.Contains(logged.String(), "saved=8bit run=fp32") {
				t.Errorf("loading 8-bit states into an fp32 run is not logged:\n%s", logged.String())
			}
			for _, d := range model.Tensors {
				m, ea, eas, err := c.ReadOptimizerState(ctx, d.Name)
				if err != nil {
					t.Fatal(err)
				}
				for k, got := range [][]float32{m, ea, eas} {
					if i := diffAt(got, saved[d.Name][k]); i >= 0 {
						t.Fatalf("%s: state %d loaded into fp32 differs from the 8-bit run's decoded state at %d", d.Name, k, i)
					}
				}
			}
		})
	}
}

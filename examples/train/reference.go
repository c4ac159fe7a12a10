package train

import (
	"context"
	"fmt"
	"math"

	"github.com/zinfio/zinf"
	"github.com/zinfio/zinf/config"
	"github.com/zinfio/zinf/plan"
	"github.com/zinfio/zinf/schedule"
	"github.com/zinfio/zinf/swapper"
	"github.com/zinfio/zinf/swapper/optimizer"
	"github.com/zinfio/zinf/swapper/param"
)

// memBackend keeps everything in Go memory: the reference the offloaded run
// must equal bit for bit. Its optimizer step applies the schedule, fp16
// loss scaling and gradient clipping in the standard order — unscale,
// check overflow, clip, update — with the global gradient norm summed in
// the order the runtimes of a world of partitions ranks sum it.
type memBackend struct {
	spec    Spec
	hyper   optimizer.Hyper
	sched   schedule.Schedule
	scaler  *schedule.LossScaler
	clip    float64
	ranks   int                    // partitions (the runtimes' world size)
	master  map[string][]float32   // fp32 master weights
	compute map[string][]float32   // master rounded to the param dtype
	states  map[string][][]float32 // the optimizer's states (Hyper.StateNames order)
	grad    map[string][]float32
	fresh   map[string]bool // no gradient accumulated since the last step
	steps   int             // applied optimizer steps
	infos   []zinf.StepInfo // per completed step: LR, loss scale, norm, clip, skip
}

// newMemBackend builds the reference for cfg (its optimizer, schedule,
// loss scaling, clipping and world size) for a run of steps optimizer
// steps (the total_num_steps of a schedule that says "auto").
func newMemBackend(spec Spec, cfg *config.Config, steps int) (*memBackend, error) {
	sched, err := schedule.FromConfig(cfg, steps)
	if err != nil {
		return nil, err
	}
	scaler, err := schedule.NewLossScalerFromConfig(cfg)
	if err != nil {
		return nil, err
	}
	_, world := cfg.RankWorld()
	b := &memBackend{spec: spec, hyper: plan.Hyper(cfg), sched: sched, scaler: scaler, clip: cfg.GradientClipping, ranks: world,
		master: map[string][]float32{}, compute: map[string][]float32{},
		states: map[string][][]float32{}, grad: map[string][]float32{}, fresh: map[string]bool{}}
	for _, n := range spec.ParamNames() {
		b.master[n] = spec.InitMaster(n)
		c := append([]float32(nil), b.master[n]...)
		spec.Quantize(c)
		b.compute[n] = c
		for range b.hyper.StateCount() {
			st := make([]float32, len(c))
			if b.hyper.Rule == optimizer.RuleAdagrad {
				for i := range st {
					st[i] = b.hyper.InitialAccumulatorValue
				}
			}
			b.states[n] = append(b.states[n], st)
		}
		b.grad[n] = make([]float32, len(c))
		b.fresh[n] = true
	}
	return b, nil
}

func (b *memBackend) beginLayer(context.Context, int, int) error { return nil }
func (b *memBackend) endLayer(int)                               {}
func (b *memBackend) startPass([]int)                            {}
func (b *memBackend) handOver(context.Context, int)              {}
func (b *memBackend) lossScale() float64                         { return b.scaler.Scale() }

func (b *memBackend) gather(_ context.Context, name string, dst []float32) error {
	copy(dst, b.compute[name])
	return nil
}

func (b *memBackend) handGrad(ctx context.Context, name string, per [][]float32, inv float32, scratch []float32) error {
	reduce(scratch, per, inv)
	if b.spec.DType == swapper.Float16 {
		b.spec.Quantize(scratch)
	}
	return b.accumulate(ctx, name, scratch)
}

func (b *memBackend) totalLoss(_ context.Context, losses []float32) (float32, error) {
	return sumLosses(losses), nil
}

func (b *memBackend) accumulate(_ context.Context, name string, g []float32) error {
	acc := b.grad[name]
	if b.fresh[name] {
		copy(acc, g)
		b.fresh[name] = false
		return nil
	}
	for i, x := range g {
		acc[i] += x
	}
	return nil
}

// sumSquares is a partition's sum of squares: float64, index order, each
// square exact, each addition rounded once.
func sumSquares(v []float32) float64 {
	var s float64
	for _, x := range v {
		d := float64(x)
		s += float64(d * d)
	}
	return s
}

// globalSumSquares sums the gradients' squares as a world of b.ranks
// runtimes does: per rank, its partition of every tensor in model order;
// then the ranks' sums in rank order.
func (b *memBackend) globalSumSquares() float64 {
	var global float64
	for r := 0; r < b.ranks; r++ {
		var local float64
		for _, n := range b.spec.ParamNames() {
			lo, hi := param.Partition(len(b.grad[n]), r, b.ranks)
			local += sumSquares(b.grad[n][lo:hi])
		}
		if r == 0 {
			global = local
		} else {
			global += local
		}
	}
	return global
}

func (b *memBackend) step(context.Context) error {
	info := zinf.StepInfo{LossScale: b.scaler.Scale(), GradNorm: math.NaN(), ClipCoef: 1}
	f := float32(1)
	if b.clip > 0 || b.scaler.Enabled() {
		sum := b.globalSumSquares()
		var norm, coef float64
		f, norm, coef = optimizer.GradFactor(sum, b.scaler.Scale(), b.clip)
		info.GradNorm = norm
		if b.scaler.Enabled() && (math.IsInf(sum, 0) || math.IsNaN(sum)) {
			if err := b.scaler.Update(true); err != nil {
				return fmt.Errorf("reference: %w", err)
			}
			for _, n := range b.spec.ParamNames() {
				b.fresh[n] = true
			}
			info.Step = b.steps + 1
			info.LR = b.sched.At(b.steps + 1).LR
			info.NextLossScale = b.scaler.Scale()
			b.infos = append(b.infos, info)
			return nil
		}
		info.ClipCoef, info.Clipped = coef, coef != 1
	}
	b.steps++
	v := b.sched.At(b.steps)
	p := optimizer.StepParams{LR: float32(v.LR), LR64: v.LR}
	if v.Betas {
		p.Beta1, p.Beta2 = float32(v.Beta1), float32(v.Beta2)
	}
	if f != 1 {
		p.ScaleGrads, p.GradScale = true, f
	}
	for _, n := range b.spec.ParamNames() {
		optimizer.Update(b.master[n], b.grad[n], b.states[n], b.steps, b.hyper, p)
		c := b.compute[n]
		copy(c, b.master[n])
		b.spec.Quantize(c)
		b.fresh[n] = true
	}
	if b.scaler.Enabled() {
		_ = b.scaler.Update(false)
	}
	info.Step, info.Applied, info.LR = b.steps, true, v.LR
	if v.Betas {
		info.Beta1, info.Beta2 = v.Beta1, v.Beta2
	}
	info.NextLossScale = b.scaler.Scale()
	b.infos = append(b.infos, info)
	return nil
}

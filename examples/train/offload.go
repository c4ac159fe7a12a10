package train

import (
	"context"
	"fmt"
	"time"

	"github.com/zinfio/zinf"
	"github.com/zinfio/zinf/policy"
	"github.com/zinfio/zinf/swapper"
)

// zinfBackend keeps the model in zinf runtimes, one per simulated rank,
// each with its own partition of every tensor and its own swap directory.
type zinfBackend struct {
	spec   Spec
	rts    []*zinf.Runtime
	scheds []*policy.Scheduler
	tiers  map[string]swapper.Tier
	// Time the loop spent blocked on I/O: layer barriers, gradient hand-off
	// (only blocks when write-behind is behind), and the optimizer's reads.
	ioWait time.Duration
	// stepped marks the ranks whose optimizer step of the current step
	// succeeded, so a retry after a failure resumes with the rest.
	stepped []bool
	// accumulated does the same for the gradient hand-off in progress.
	accumulated []bool
	// optSteps records each optimizer step call: duration and NVMe bytes.
	optSteps []optStep
}

type optStep struct {
	d             time.Duration
	read, written int64
}

func (b *zinfBackend) startPass(order []int) {
	for _, s := range b.scheds {
		s.StartPass(order)
	}
}

func (b *zinfBackend) beginLayer(ctx context.Context, l int) error {
	t0 := time.Now()
	defer func() { b.ioWait += time.Since(t0) }()
	for r, s := range b.scheds {
		if err := s.Begin(ctx, l); err != nil {
			return fmt.Errorf("rank %d: %w", r, err)
		}
	}
	return nil
}

func (b *zinfBackend) gather(ctx context.Context, name string, dst []float32) error {
	for r, rt := range b.rts {
		lo, hi := rt.Partition(name)
		if lo == hi {
			continue
		}
		if err := rt.Params.ReadFloat32(ctx, name, dst[lo:hi]); err != nil {
			return fmt.Errorf("rank %d: %w", r, err)
		}
	}
	return nil
}

// fetch is gather outside the layer loop: it swaps the parameter in on
// every rank, reads it, and releases it again.
func (b *zinfBackend) fetch(ctx context.Context, name string, dst []float32) error {
	for r, rt := range b.rts {
		if err := rt.Params.SwapIn(ctx, name); err != nil {
			return fmt.Errorf("rank %d: %w", r, err)
		}
	}
	defer func() {
		for _, rt := range b.rts {
			rt.Params.Release(name)
		}
	}()
	return b.gather(ctx, name, dst)
}

func (b *zinfBackend) handOver(ctx context.Context, l int) {
	for _, rt := range b.rts {
		for _, n := range []string{WeightName(l), BiasName(l)} {
			// A failure here fails the step too, where it is handled (and
			// the step retried as a whole); nothing is lost by going on.
			_ = rt.StepTensor(ctx, n)
		}
	}
}

func (b *zinfBackend) endLayer(l int) {
	for _, s := range b.scheds {
		s.End(l)
	}
}

func (b *zinfBackend) accumulate(ctx context.Context, name string, g []float32) error {
	t0 := time.Now()
	defer func() { b.ioWait += time.Since(t0) }()
	if b.accumulated == nil {
		b.accumulated = make([]bool, len(b.rts))
	}
	// As for step: a retry must not add the gradient twice on the ranks
	// whose hand-off succeeded.
	for r, rt := range b.rts {
		lo, hi := rt.Partition(name)
		if lo == hi || b.accumulated[r] {
			continue
		}
		if err := rt.Grads.Accumulate(ctx, name, g[lo:hi]); err != nil {
			return fmt.Errorf("rank %d: %w", r, err)
		}
		b.accumulated[r] = true
	}
	clear(b.accumulated)
	return nil
}

func (b *zinfBackend) step(ctx context.Context) error {
	t0 := time.Now()
	before := metrics(b.rts)
	defer func() {
		d := time.Since(t0)
		b.ioWait += d
		after := metrics(b.rts)
		b.optSteps = append(b.optSteps, optStep{d: d, read: after.BytesRead - before.BytesRead, written: after.BytesWritten - before.BytesWritten})
	}()
	if b.stepped == nil {
		b.stepped = make([]bool, len(b.rts))
	}
	// A retried step must not step again the ranks that already did: each
	// rank's step is all or nothing, the set of ranks is not.
	for r, rt := range b.rts {
		if b.stepped[r] {
			continue
		}
		if err := rt.Step(ctx); err != nil {
			return fmt.Errorf("rank %d: %w", r, err)
		}
		b.stepped[r] = true
	}
	clear(b.stepped)
	return nil
}

// newZinfBackend registers the model's parameters in each runtime on the
// tiers the placement chose, and builds a prefetch scheduler per rank.
func newZinfBackend(ctx context.Context, spec Spec, rts []*zinf.Runtime, pl *policy.Placement, prefetch int) (*zinfBackend, error) {
	b := &zinfBackend{spec: spec, rts: rts, tiers: map[string]swapper.Tier{}}
	for _, n := range spec.ParamNames() {
		tier, ok := pl.Tier[n]
		if !ok {
			tier = swapper.TierNVMe
		}
		if rts[0].ParamStore == nil && tier == swapper.TierNVMe {
			tier = swapper.TierCPU
		}
		b.tiers[n] = tier
		master := spec.InitMaster(n)
		for r, rt := range rts {
			if err := rt.RegisterParam(ctx, n, tier, master); err != nil {
				return nil, fmt.Errorf("rank %d: registering %s: %w", r, n, err)
			}
		}
	}
	layers := make([][]string, spec.Layers)
	for l := range layers {
		for _, n := range []string{WeightName(l), BiasName(l)} {
			if b.tiers[n] == swapper.TierNVMe {
				layers[l] = append(layers[l], n)
			}
		}
	}
	for _, rt := range rts {
		rt := rt
		size := func(name string) int64 {
			n, err := rt.Params.PartitionLen(name)
			if err != nil {
				return 0
			}
			return policy.PoolBlockBytes(int64(n * rt.DType.Size()))
		}
		budget := rt.Pool.CapacityBytes() / 2
		b.scheds = append(b.scheds, policy.NewScheduler(pl, layers, rt.Params, policy.SchedulerOptions{Depth: prefetch, BudgetBytes: budget, SizeOf: size}))
	}
	return b, nil
}

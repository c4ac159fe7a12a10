package zinf

// Open builds a Runtime (check, measure, plan, build) and Close takes it
// down again.

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"github.com/zinfio/zinf/config"
	"github.com/zinfio/zinf/plan"
	"github.com/zinfio/zinf/swapper"
)

// Open builds a Runtime for model from cfg: it checks both (plan.Check:
// every problem is reported), measures what the plan depends on (the
// memory the pinned pool may take; each NVMe path's bandwidth) and
// computes the swap stores' geometry from the config (plan.GeometryOf:
// nothing is opened to plan), plans placement and prefetch, the pinned
// pool by reservation and the disk (plan.Make), and builds from the plan
// alone: the engine and swap stores, their space, the pool, device,
// swappers and scheduler — refusing, with a *PoolTooSmallError naming the
// minimum and the key to change, a pool that cannot work, an NVMe path
// short of free space, and a swap store whose device needs transfers
// aligned to more than the 4 KiB the plan sizes for. Every tensor must
// then get its initial values with Init. Nothing is left behind on
// failure: whatever was built is closed again.
func Open(cfg *config.Config, model Model, opts Options) (rt *Runtime, err error) {
	in, err := plan.Check(cfg, model, plan.Given{Rank: opts.Rank, WorldSize: opts.WorldSize, PieceBytes: opts.PieceBytes})
	if err != nil {
		return nil, err
	}
	// Whatever is built from here on is closed again on failure.
	r := &Runtime{numel: map[string]int{}, inited: map[string]bool{}}
	defer func() {
		if err != nil {
			r.Close()
			rt = nil
		}
	}()
	log := opts.Logger
	if log == nil {
		log = slog.Default()
	}
	if opts.InPlace && !opts.Inference {
		return nil, errors.New("zinf: Options.InPlace is for an inference runtime (Options.Inference): a training runtime writes its parameters")
	}
	r.Config, r.Rank, r.World, r.DType, r.log, r.model, r.inference = cfg, in.Rank, in.World, in.Settings.DType, log, in.Model, opts.Inference
	r.inPlace = opts.InPlace
	// Measure what the plan depends on (memory, the NVMe bandwidth; the
	// stores' geometry is computed), plan, and build from the plan.
	m, pending, err := r.measure(&in.Settings, opts)
	if err != nil {
		return nil, err
	}
	p, err := plan.Make(in, m, plan.Options{ComputePerLayer: opts.ComputePerLayer, Inference: opts.Inference, InPlace: opts.InPlace,
		Gather: opts.GatherLayers && opts.Comm != nil, PieceBytes: opts.PieceBytes})
	if err != nil {
		return nil, err
	}
	if err := r.build(p, opts); err != nil {
		return nil, err
	}
	// The run goes ahead: cache what the probe measured (not before, so
	// that a refused config leaves nothing in the NVMe paths).
	storeProbes(pending, log)
	return r, nil
}

// Close drains in-flight I/O, closes the swappers, removes the scratch swap
// files, frees pinned memory and closes what Open built. It is idempotent
// and returns every error met.
func (r *Runtime) Close() error {
	if r == nil {
		return nil
	}
	r.mu.Lock()
	closed := r.closed
	r.closed = true
	r.mu.Unlock()
	if closed {
		return nil
	}
	var errs []error
	add := func(what string, err error) {
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", what, err))
		}
	}
	// Gathers in flight end first: they read partitions and write pinned
	// memory.
	r.closeDist()
	if r.txn != nil {
		r.txn.Abort()
		r.txn = nil
	}
	if r.sched != nil {
		// Layers prefetched for a pass that never came (ForwardRepeating's
		// last pass) and layers left begun go back before the swapper
		// closes (and before a step's update below waits for the pool).
		r.sched.Reset()
	}
	if bg := r.bg; bg != nil {
		// Step returned: the step is the loop's, so it lands (its commit
		// always ends: its I/O returns, and a pool that gives nothing back
		// fails it after zinf.pinned_stall_timeout).
		if err := bg.txn.Wait(context.Background()); err != nil {
			add(fmt.Sprintf("step %d's update, which ran on after Step returned", bg.step()), err)
		}
		r.bg = nil
	}
	if r.bgCancel != nil {
		r.bgCancel()
	}
	if r.Optimizer != nil {
		add("optimizer", r.Optimizer.Close())
	}
	if r.grads != nil {
		add("grads", r.grads.Close())
	}
	if r.Params != nil {
		add("params", r.Params.Close())
	}
	for _, s := range []*swapper.Store{r.ParamStore, r.GradStore, r.OptimStore} {
		if s != nil {
			add("store", s.Close())
		}
	}
	add("device I/O", r.closeDeviceIO())
	if r.ownEngine && r.Engine != nil {
		add("engine", r.Engine.Close())
	}
	if r.device != nil && r.pool != nil {
		for _, reg := range r.pool.Regions() {
			r.device.UnregisterHost(reg)
		}
	}
	if r.ownDevice && r.device != nil {
		add("device", r.device.Close())
	}
	if r.pool != nil {
		add("pool", r.pool.Close())
	}
	if len(errs) > 0 {
		return fmt.Errorf("zinf: close: %w", errors.Join(errs...))
	}
	return nil
}

package train

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/zinfio/zinf"
	"github.com/zinfio/zinf/buffers"
	"github.com/zinfio/zinf/internal/base/testhook"
	"github.com/zinfio/zinf/swapper"
	"github.com/zinfio/zinf/tensor"
)

// Model describes spec's tensors for zinf.Open: per layer a Width x Width
// weight and a Width bias.
func (s Spec) Model() zinf.Model {
	layers := make([][]tensor.Desc, s.Layers)
	for l := range layers {
		layers[l] = []tensor.Desc{{Name: WeightName(l), Shape: []int{s.Width, s.Width}}, {Name: BiasName(l), Shape: []int{s.Width}}}
	}
	return zinf.LayeredModel(layers...)
}

// zinfBackend keeps the model in zinf runtimes, one per simulated rank,
// each with its own partition of every tensor and its own swap directory.
// It uses only the runtime's loop API: the runtime plans, prefetches and
// owns pinned memory.
type zinfBackend struct {
	spec Spec
	rts  []*zinf.Runtime
	// run is what checkpoints record of the run (Run fills it; tests that
	// drive the backend directly leave it zero and record none).
	run runMeta
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
	// infos records rank 0's account of each completed step (LR, loss
	// scale, norm, clipping, skip, rollback); every rank decides the same.
	infos []zinf.StepInfo
	// sample, when set, checks sampled elements of some tensors every
	// step (Options.Sample).
	sample *sampler
}

type optStep struct {
	d             time.Duration
	read, written int64
}

func (b *zinfBackend) startPass(order []int) {
	for _, rt := range b.rts {
		rt.Pass(order)
	}
}

func (b *zinfBackend) beginLayer(ctx context.Context, l, k int) error {
	t0 := time.Now()
	defer func() { b.ioWait += time.Since(t0) }()
	for r, rt := range b.rts {
		if err := rt.BeginLayerMicroBatches(ctx, l, k); err != nil {
			return fmt.Errorf("rank %d: %w", r, err)
		}
	}
	return nil
}

// gather reads every rank's partition into dst (the full tensor).
func (b *zinfBackend) gather(ctx context.Context, name string, dst []float32) error {
	for r, rt := range b.rts {
		if err := rt.ReadParam(ctx, name, dst); err != nil {
			return fmt.Errorf("rank %d: %w", r, err)
		}
	}
	if b.sample != nil {
		return b.sample.read(name, dst)
	}
	return nil
}

func (b *zinfBackend) handOver(ctx context.Context, l int) {
	for _, rt := range b.rts {
		// A failure here fails the step too, where it is handled (and the
		// step retried as a whole); nothing is lost by going on.
		_ = rt.StepLayer(ctx, l)
	}
}

func (b *zinfBackend) endLayer(l int) {
	for _, rt := range b.rts {
		rt.EndLayer(l)
	}
}

func (b *zinfBackend) handGrad(ctx context.Context, name string, per [][]float32, inv float32, scratch []float32) error {
	reduce(scratch, per, inv)
	if b.spec.DType == swapper.Float16 {
		b.spec.Quantize(scratch)
	}
	return b.accumulate(ctx, name, scratch)
}

func (b *zinfBackend) totalLoss(_ context.Context, losses []float32) (float32, error) {
	return sumLosses(losses), nil
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
		if b.accumulated[r] {
			continue
		}
		if err := rt.AccumulateGrad(ctx, name, g); err != nil {
			return fmt.Errorf("rank %d: %w", r, err)
		}
		b.accumulated[r] = true
		testhook.Hit("train/accumulate")
	}
	clear(b.accumulated)
	if b.sample != nil {
		b.sample.accumulated(name, g)
	}
	return nil
}

func (b *zinfBackend) lossScale() float64 { return b.rts[0].LossScale() }

// abortStep gives the step in progress up on every rank (its gradients
// and any update it started), so that it can run again from the start.
func (b *zinfBackend) abortStep() {
	for _, rt := range b.rts {
		rt.AbortStep()
	}
	clear(b.accumulated)
}

// stepHook, when set (by a benchmark), is called just before and just
// after each optimizer step.
var stepHook func(begin bool)

func (b *zinfBackend) step(ctx context.Context) error {
	if stepHook != nil {
		stepHook(true)
		defer stepHook(false)
	}
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
	// rank's step is all or nothing, the set of ranks is not. The ranks
	// step at once, each on its own goroutine, as processes would: with
	// gradient_clipping or fp16 their steps reduce the norm and overflow
	// over the world (a rank that fails before that makes every rank fail,
	// so they retry together; one that fails after it retries alone).
	errs := make([]error, len(b.rts))
	var wg sync.WaitGroup
	for r, rt := range b.rts {
		if b.stepped[r] {
			continue
		}
		wg.Go(func() {
			if err := rt.Step(ctx); err != nil {
				errs[r] = fmt.Errorf("rank %d: %w", r, err)
				return
			}
			b.stepped[r] = true
			testhook.Hit("train/step")
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return firstErr(errs)
	}
	clear(b.stepped)
	b.infos = append(b.infos, b.rts[0].LastStep())
	return nil
}

// firstErr returns the error of the lowest rank that failed, preferring
// a rank's own failure to another rank's report of it (zinf.ErrRankFailed).
func firstErr(errs []error) error {
	var other error
	for _, err := range errs {
		if err == nil {
			continue
		}
		if !errors.Is(err, zinf.ErrRankFailed) {
			return err
		}
		if other == nil {
			other = err
		}
	}
	return other
}

// readAll reads every parameter's full compute values, layer by layer.
// v is valid during fn only: one buffer serves every tensor, so reading a
// model costs its largest tensor, not its size.
func (b *zinfBackend) readAll(ctx context.Context, fn func(name string, v []float32) error) error {
	order := make([]int, b.spec.Layers)
	for l := range order {
		order[l] = l
	}
	b.startPass(order)
	buf := make([]float32, b.spec.Numel(WeightName(0)))
	for l := range order {
		if err := b.beginLayer(ctx, l, 1); err != nil {
			return err
		}
		for _, n := range []string{WeightName(l), BiasName(l)} {
			v := buf[:b.spec.Numel(n)]
			if err := b.gather(ctx, n, v); err != nil {
				b.endLayer(l)
				return err
			}
			if err := fn(n, v); err != nil {
				b.endLayer(l)
				return err
			}
		}
		b.endLayer(l)
	}
	return nil
}

// newZinfBackend gives every rank's runtime the model's initial values.
func newZinfBackend(ctx context.Context, spec Spec, rts []*zinf.Runtime) (*zinfBackend, error) {
	b := &zinfBackend{spec: spec, rts: rts}
	for _, n := range spec.ParamNames() {
		master := spec.InitMaster(n)
		for r, rt := range rts {
			if err := rt.Init(ctx, n, master); err != nil {
				return nil, fmt.Errorf("rank %d: %w", r, err)
			}
		}
	}
	return b, nil
}

// stateDigest is the digest of the runtimes' final state (see
// Result.StateSHA256): full parameters read layer by layer, each followed
// by its optimizer states put together from every rank's partition. It
// streams: it holds one tensor's master weights and states at a time (in
// buffers reused from tensor to tensor), never the model's, so a model
// larger than memory gets its digest too.
func (b *zinfBackend) stateDigest(ctx context.Context) (string, error) {
	h := sha256.New()
	var bufs [][]float32
	err := b.readAll(ctx, func(n string, v []float32) error {
		h.Write(buffers.AsBytes(v))
		numel := len(v)
		for _, rt := range b.rts {
			lo, hi := rt.Partition(n)
			if lo == hi {
				continue
			}
			err := rt.VisitOptimizerStates(ctx, n, func(off int, master []float32, states [][]float32) error {
				arrays := 1 + len(states)
				for len(bufs) < arrays {
					bufs = append(bufs, nil)
				}
				for k := range arrays {
					if cap(bufs[k]) < numel {
						bufs[k] = make([]float32, numel)
					}
					bufs[k] = bufs[k][:numel]
					src := master
					if k > 0 {
						src = states[k-1]
					}
					copy(bufs[k][lo+off:], src)
				}
				return nil
			})
			if err != nil {
				return fmt.Errorf("rank %d: %w", rt.Rank, err)
			}
		}
		for _, a := range bufs {
			h.Write(buffers.AsBytes(a[:numel]))
		}
		return nil
	})
	if err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// recoverUpdate implements updateRecoverer: each rank's step is its own
// (all or nothing per rank), so only the ranks whose update failed step
// again — alone: the check their step reduced over the ranks is kept.
func (b *zinfBackend) recoverUpdate(ctx context.Context, retry func(error) bool) error {
	for r, rt := range b.rts {
		if err := retryFailedUpdate(ctx, rt, retry); err != nil {
			return fmt.Errorf("rank %d: %w", r, err)
		}
	}
	if len(b.infos) > 0 {
		b.infos[len(b.infos)-1] = b.rts[0].LastStep() // the retried step's, if it was
	}
	return nil
}

// retryFailedUpdate waits for rt's last step's update and, when it failed
// after Step returned (zinf.ErrUpdateFailed), runs the step again while
// retry allows. (A retried step may fail after Step returned again: the
// next step's calls report it, and it is retried once more.)
func retryFailedUpdate(ctx context.Context, rt *zinf.Runtime, retry func(error) bool) error {
	err := rt.WaitStep(ctx)
	if err == nil {
		return nil
	}
	if !errors.Is(err, zinf.ErrUpdateFailed) || !retry(err) {
		return err
	}
	for {
		if err = rt.Step(ctx); err == nil || !retry(err) {
			return err
		}
	}
}

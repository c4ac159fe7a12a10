package train

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"time"

	"github.com/zinfio/zinf"
	"github.com/zinfio/zinf/buffers"
	"github.com/zinfio/zinf/checkpoint"
	"github.com/zinfio/zinf/comm"
	"github.com/zinfio/zinf/internal/base/testhook"
	"github.com/zinfio/zinf/plan"
	"github.com/zinfio/zinf/policy"
	"github.com/zinfio/zinf/swapper"
	"github.com/zinfio/zinf/swapper/param"
)

// DistResult is what a run whose ranks are processes adds to Result.
type DistResult struct {
	// Ranks is the number of processes; DataParallel ranks are spread
	// over them in consecutive blocks.
	Ranks int `json:"ranks"`
	// Per rank and step, rank 0's and the largest over the ranks: the
	// bytes the collectives moved (sent + received, as addressed), and
	// the time the loop waited for gathers.
	CommBytesPerStep    int64   `json:"comm_bytes_per_step_rank0"`
	MaxCommBytesPerStep int64   `json:"comm_bytes_per_step_max"`
	GatherWaitMsPerStep float64 `json:"gather_wait_ms_per_step_rank0"`
	GatheredAhead       int64   `json:"layers_gathered_ahead_rank0"`
	// AllEqual: every rank's partition of the final state equals the
	// in-memory reference (with Verify).
	AllEqual *bool `json:"all_ranks_equal,omitempty"`
}

// blocks returns, for data data-parallel ranks over procs processes, each
// process's first data rank and how many it computes.
func blocks(data, procs int) (first, per []int) {
	first, per = make([]int, procs), make([]int, procs)
	for p := range procs {
		lo, hi := p*data/procs, (p+1)*data/procs
		first[p], per[p] = lo, hi-lo
	}
	return first, per
}

// distBackend is one rank of a job whose ranks are processes: its own
// runtime, whose BeginLayer gathers the full parameters from every rank
// and whose ReduceGrads reduce-scatters the gradients, in rank order.
type distBackend struct {
	spec        Spec
	rt          *zinf.Runtime
	c           comm.Comm
	first, per  []int // data-parallel ranks per process
	run         runMeta
	ioWait      time.Duration
	optSteps    []optStep
	infos       []zinf.StepInfo // each completed step's account (every rank decides the same)
	lossScratch []byte
}

func (b *distBackend) startPass(order []int) { b.rt.Pass(order) }

func (b *distBackend) beginLayer(ctx context.Context, l, k int) error {
	t0 := time.Now()
	defer func() { b.ioWait += time.Since(t0) }()
	return b.rt.BeginLayerMicroBatches(ctx, l, k)
}

func (b *distBackend) gather(ctx context.Context, name string, dst []float32) error {
	return b.rt.ReadParam(ctx, name, dst)
}

func (b *distBackend) endLayer(l int) { b.rt.EndLayer(l) }

func (b *distBackend) handOver(ctx context.Context, l int) { _ = b.rt.StepLayer(ctx, l) }

func (b *distBackend) handGrad(ctx context.Context, name string, per [][]float32, inv float32, _ []float32) error {
	t0 := time.Now()
	defer func() { b.ioWait += time.Since(t0) }()
	data := 0
	for _, n := range b.per {
		data += n
	}
	scale := float32(1)
	if data > 1 {
		scale = inv
	}
	how := zinf.GradReduce{Per: b.per, Scale: scale}
	if b.spec.DType == swapper.Float16 {
		how.Round = swapper.Float16 // as the in-process loop rounds the reduced gradient
	}
	if err := b.rt.ReduceGrads(ctx, name, per, how); err != nil {
		return err
	}
	testhook.Hit("train/reduce")
	return nil
}

// totalLoss gathers every rank's losses and sums them in the loop's
// order: micro-step by micro-step, data-parallel rank by rank.
func (b *distBackend) totalLoss(ctx context.Context, losses []float32) (float32, error) {
	P := len(b.per)
	micro := 0
	if b.per[b.rt.Rank] > 0 {
		micro = len(losses) / b.per[b.rt.Rank]
	} else {
		// This rank computes no data-parallel rank; the others know the
		// micro-steps: the loop's losses slice has Micro x 0 entries.
		micro = b.run.Micro
	}
	counts := make([]int, P)
	for q := range P {
		counts[q] = 4 * micro * b.per[q]
	}
	off, total := comm.Offsets(counts)
	if cap(b.lossScratch) < total {
		b.lossScratch = make([]byte, total)
	}
	all := b.lossScratch[:total]
	mine := buffers.AsBytes(losses)
	if err := b.rt.Collective(ctx, func(c comm.Comm) error { return c.AllGather(ctx, mine, all, counts) }); err != nil {
		return 0, err
	}
	var loss float32
	for m := range micro {
		for q := range P {
			for i := range b.per[q] {
				at := off[q] + 4*(m*b.per[q]+i)
				loss += math.Float32frombits(binary.LittleEndian.Uint32(all[at:]))
			}
		}
	}
	return loss, nil
}

func (b *distBackend) lossScale() float64 { return b.rt.LossScale() }

func (b *distBackend) step(ctx context.Context) error {
	t0 := time.Now()
	before := b.rt.Metrics()
	defer func() {
		d := time.Since(t0)
		b.ioWait += d
		after := b.rt.Metrics()
		b.optSteps = append(b.optSteps, optStep{d: d, read: after.BytesRead - before.BytesRead, written: after.BytesWritten - before.BytesWritten})
	}()
	if err := b.rt.Step(ctx); err != nil {
		return err
	}
	b.infos = append(b.infos, b.rt.LastStep())
	return nil
}

func (b *distBackend) checkpointMeta(step int) zinf.CheckpointMeta {
	z := &zinfBackend{spec: b.spec, run: b.run}
	return z.checkpointMeta(step)
}

// runRank is Run for one rank of a job whose ranks are processes
// (Options.Comm): see Run.
func runRank(ctx context.Context, o Options) (res *Result, err error) {
	c := o.Comm
	me, procs := c.Rank(), c.Size()
	defer func() {
		if err != nil {
			// The other ranks must not wait for this one.
			c.Abort(fmt.Errorf("rank %d: %w", me, err))
		}
	}()
	cfg := o.Config
	if _, w := cfg.RankWorld(); w != procs {
		return nil, fmt.Errorf("train: zinf.world_size is %d (from the config file, else $WORLD_SIZE, $OMPI_COMM_WORLD_SIZE or $SLURM_NTASKS), but the job has %d ranks (processes)", w, procs)
	}
	spec := o.Spec
	spec.DType = plan.ParamDType(cfg)
	if err := spec.Validate(); err != nil {
		return nil, err
	}
	log := o.Logger
	if log == nil {
		log = slog.Default()
	}
	micro := max(cfg.GradientAccumulationSteps, 1)
	data := o.DataParallel
	if data == 0 {
		data = procs
	}
	run := runMeta{Layers: spec.Layers, Width: spec.Width, Batch: spec.Batch, Seed: spec.Seed, DType: spec.DType.String(),
		Micro: micro, DataParallel: data, Hyper: plan.Hyper(cfg)}
	res = &Result{Steps: o.Steps, Params: spec.ParamCount(), StateBytes: spec.StateBytes(), World: procs, DType: spec.DType.String(),
		Dist: &DistResult{Ranks: procs}}
	var ckpt *zinf.Checkpointer
	var from checkpoint.Info
	if o.CheckpointDir != "" {
		if o.CheckpointAsync {
			return nil, errors.New("train: asynchronous checkpoints (--checkpoint-async) are not supported when the ranks are processes: save synchronously")
		}
		if from, run, err = checkRoot(o, run); err != nil {
			return nil, err
		}
		ckpt, err = zinf.OpenCheckpointer(o.CheckpointDir, zinf.CheckpointerOptions{Every: int64(o.CheckpointEvery), KeepLast: o.CheckpointKeep,
			Logger: log, Comm: c})
		if err != nil {
			return nil, err
		}
		defer ckpt.Close()
	}
	data = run.DataParallel
	first, per := blocks(data, procs)
	rt, err := zinf.Open(cfg, spec.Model(), zinf.Options{Logger: log, Rank: me, WorldSize: procs, Faults: o.Faults, Comm: c, GatherLayers: true,
		ComputePerLayer: o.ComputePerLayer, PrefetchDepth: o.PrefetchDepth, SerialStep: o.SerialStep, TotalSteps: o.Steps})
	if err != nil {
		return nil, fmt.Errorf("rank %d: %w", me, err)
	}
	defer rt.Close()
	res.Backend = rt.Engine.Name()
	pl := rt.Placement()
	res.PrefetchDepth = pl.PrefetchDepth
	if o.PrefetchDepth > 0 {
		res.PrefetchDepth = o.PrefetchDepth
	}
	if rt.Reservations().PrefetchBytes == 0 {
		res.PrefetchDepth = 0
	}
	res.OverlapStep = !o.SerialStep && pl.OverlapStep
	res.PredictedMs = float64(pl.Predicted.Total) / 1e6
	// Every rank runs the loop in one order (BeginLayer gathers are
	// collectives): layer-major only when every rank's plan says so (each
	// plans its own partitions, which may tip auto apart).
	votes := []float64{0}
	if rt.Schedule() == zinf.LayerMajor {
		votes[0] = 1
	}
	if err := rt.Collective(ctx, func(c comm.Comm) error { return c.AllReduceFloat64(ctx, votes, comm.Sum) }); err != nil {
		return nil, fmt.Errorf("rank %d: agreeing on the schedule: %w", me, err)
	}
	layerMajor := votes[0] == float64(procs)
	res.Schedule = string(zinf.MicroBatchMajor)
	if layerMajor {
		res.Schedule = string(zinf.LayerMajor)
	}
	if o.Progress != nil {
		fmt.Fprintf(o.Progress, "model: %d layers x width %d (%s params, %s of state, %s), %d ranks (processes), data-parallel degree %d, %d micro-steps per step\n",
			spec.Layers, spec.Width, human(float64(res.Params)), policy.FormatBytes(res.StateBytes), spec.DType, procs, data, micro)
		pl.WriteTable(o.Progress)
		fmt.Fprintf(o.Progress, "\npinned memory by reservation (rank 0):\n%s\n", rt.Reservations())
	}
	for _, n := range spec.ParamNames() {
		if err := rt.Init(ctx, n, spec.InitMaster(n)); err != nil {
			return nil, fmt.Errorf("rank %d: %w", me, err)
		}
	}
	be := &distBackend{spec: spec, rt: rt, c: c, first: first, per: per, run: run}
	start := 0
	if o.Resume {
		meta, err := zinf.LoadCheckpoint(ctx, from.Dir, []*zinf.Runtime{rt})
		if err != nil {
			return nil, fmt.Errorf("rank %d: %w", me, err)
		}
		start = int(meta.Step)
		res.Resumed = &Resumed{Step: start, Dir: from.Dir, WorldSize: from.WorldSize, DataParallel: data}
		if o.Progress != nil {
			fmt.Fprintf(o.Progress, "resumed from %s: step %d of %d (saved at world size %d; data-parallel degree %d)\n", from.Dir, start, o.Steps, from.WorldSize, data)
		}
	}
	res.DataParallel, res.StepsRun = data, o.Steps-start
	var ioWaits []float64
	var last zinf.Metrics
	lastWait := time.Duration(0)
	t0 := time.Now()
	err = runLoop(ctx, spec, be, loopOptions{Start: start, Steps: o.Steps - start, Micro: micro, World: data, Part: true, First: first[me], Local: per[me],
		ComputePerLayer: o.ComputePerLayer, OnStepError: o.OnStepError, OverlapStep: res.OverlapStep, LayerMajor: layerMajor,
		OnStep: func(step int, loss float32, d time.Duration) error {
			m := rt.Metrics()
			w := be.ioWait - lastWait
			lastWait = be.ioWait
			res.StepMs = append(res.StepMs, float64(d)/1e6)
			ioWaits = append(ioWaits, float64(w)/1e6)
			res.FinalLoss = loss
			rep := report(step, loss, d, be.infos[len(be.infos)-1])
			res.PerStep = append(res.PerStep, rep)
			if o.Progress != nil {
				moved := commBytes(m.Comm) - commBytes(last.Comm)
				fmt.Fprintf(o.Progress, "step %3d/%d  loss %.6f  %7.1f ms  io-wait %6.1f ms  read %s  written %s  collectives %s (rank 0)%s\n", step+1, o.Steps, loss,
					float64(d)/1e6, float64(w)/1e6, policy.FormatBytes(m.BytesRead-last.BytesRead), policy.FormatBytes(m.BytesWritten-last.BytesWritten),
					policy.FormatBytes(moved), rep.describe())
			}
			last = m
			if ckpt != nil && (step+1 == o.Steps || ckpt.Due(int64(step+1))) {
				t1 := time.Now()
				if err := ckpt.Save(ctx, []*zinf.Runtime{rt}, be.checkpointMeta(step+1)); err != nil {
					return fmt.Errorf("checkpoint after step %d: %w", step+1, err)
				}
				if o.Progress != nil {
					fmt.Fprintf(o.Progress, "checkpoint %s: committed in %.1f ms\n", zinf.CheckpointName(int64(step+1)), float64(time.Since(t1))/1e6)
				}
			}
			if o.OnStep != nil {
				return o.OnStep(step)
			}
			return nil
		}})
	if err != nil {
		return nil, err
	}
	if ckpt != nil {
		if err := ckpt.Close(); err != nil {
			return nil, err
		}
		res.Checkpoints = ckpt.Records()
	}
	m := rt.Metrics()
	res.fill(m, m.Train, time.Since(t0), ioWaits, float64(o.ComputePerLayer)/1e6*float64(2*spec.Layers*micro), be.optSteps)
	res.DemandMisses = int64(m.Schedule.DemandMisses)
	if steps := o.Steps - start; steps > 0 {
		mine := float64(commBytes(m.Comm)) / float64(steps)
		most := []float64{mine}
		if err := rt.Collective(ctx, func(c comm.Comm) error { return c.AllReduceFloat64(ctx, most, comm.Max) }); err != nil {
			return nil, err
		}
		res.Dist.CommBytesPerStep, res.Dist.MaxCommBytesPerStep = int64(mine), int64(most[0])
		res.Dist.GatherWaitMsPerStep = float64(m.Comm.GatherWait) / 1e6 / float64(steps)
		res.Dist.GatheredAhead = m.Comm.GatheredAhead
	}
	// The final state (full parameters, every rank's optimizer states)
	// is the same on every rank: its digest names it.
	full, digest, err := finalState(ctx, be)
	if err != nil {
		return nil, err
	}
	res.StateSHA256 = digest
	if !o.Verify {
		return res, nil
	}
	ref, err := newMemBackend(spec, cfg, o.Steps)
	if err != nil {
		return nil, err
	}
	var refMs []float64
	if err := runLoop(ctx, spec, ref, loopOptions{Steps: o.Steps, Micro: micro, World: data, ComputePerLayer: o.ComputePerLayer,
		OnStep: func(_ int, _ float32, d time.Duration) error { refMs = append(refMs, float64(d)/1e6); return nil }}); err != nil {
		return nil, fmt.Errorf("reference run: %w", err)
	}
	res.InMemoryStepMsMedian = median(refMs)
	why := ""
	names := append([]string{"param", "master"}, ref.hyper.StateNames()...)
	for _, n := range spec.ParamNames() {
		want := append([][]float32{ref.compute[n], ref.master[n]}, ref.states[n]...)
		if len(full[n]) != len(want) {
			if why == "" {
				why = fmt.Sprintf("%s: %d state tensors, reference %d", n, len(full[n]), len(want))
			}
			continue
		}
		for k := range want {
			if i, ok := sameBits(full[n][k], want[k]); !ok && why == "" {
				why = fmt.Sprintf("%s %s element %d: %v vs reference %v", n, names[k], i, full[n][k][i], want[k][i])
			}
		}
	}
	// Every step decided the same: the reference sums the gradient norm
	// over the same partitions (the config's world size is the job's).
	if why == "" {
		why = sameDecisions(be.infos, ref.infos, true)
	}
	// Every rank compared the whole state: one verdict (any rank that
	// differs makes it false).
	flag := []float64{0}
	if why != "" {
		flag[0] = 1
	}
	if err := rt.Collective(ctx, func(c comm.Comm) error { return c.AllReduceFloat64(ctx, flag, comm.Max) }); err != nil {
		return nil, err
	}
	eq := why == "" && flag[0] == 0
	if why == "" && !eq {
		why = "another rank's state differs from the reference"
	}
	res.BitwiseEqual, res.Mismatch = &eq, why
	res.Dist.AllEqual = &eq
	return res, nil
}

func commBytes(s zinf.CommStats) int64 {
	return s.GatherSent + s.GatherReceived + s.ReduceScatterSent + s.ReduceScatterReceived
}

// finalState reads the whole final state on every rank: the full
// parameters (gathered), the full fp32 master and optimizer states (every
// rank's partitions, all-gathered); and its digest.
func finalState(ctx context.Context, b *distBackend) (map[string][][]float32, string, error) {
	rt := b.rt
	out := map[string][][]float32{}
	order := make([]int, b.spec.Layers)
	for l := range order {
		order[l] = l
	}
	rt.Pass(order)
	for l := range order {
		if err := rt.BeginLayer(ctx, l); err != nil {
			return nil, "", err
		}
		for _, n := range []string{WeightName(l), BiasName(l)} {
			v := make([]float32, b.spec.Numel(n))
			if err := rt.ReadParam(ctx, n, v); err != nil {
				rt.EndLayer(l)
				return nil, "", err
			}
			out[n] = [][]float32{v}
		}
		rt.EndLayer(l)
	}
	for _, n := range b.spec.ParamNames() {
		master, states, err := rt.ReadOptimizerStates(ctx, n)
		if err != nil {
			return nil, "", err
		}
		for _, part := range append([][]float32{master}, states...) {
			full, err := allGatherPartitions(ctx, rt, b.spec, n, part)
			if err != nil {
				return nil, "", err
			}
			out[n] = append(out[n], full)
		}
	}
	return out, stateDigest(b.spec, out), nil
}

// allGatherPartitions gathers a tensor's partitions from every rank.
func allGatherPartitions(ctx context.Context, rt *zinf.Runtime, spec Spec, name string, part []float32) ([]float32, error) {
	counts := make([]int, rt.World)
	numel := 0
	for q := range counts {
		lo, hi := partitionOf(rt, spec, name, q)
		counts[q] = 4 * (hi - lo)
		numel = max(numel, hi)
	}
	full := make([]float32, numel)
	err := rt.Collective(ctx, func(c comm.Comm) error {
		return c.AllGather(ctx, buffers.AsBytes(part), buffers.AsBytes(full), counts)
	})
	return full, err
}

// partitionOf is rank q's element range of name.
func partitionOf(rt *zinf.Runtime, spec Spec, name string, q int) (lo, hi int) {
	return param.Partition(spec.Numel(name), q, rt.World)
}

// stateDigest is the SHA-256 of the final state, tensor by tensor in the
// model's order: the parameter as compute reads it, then the fp32 master
// and the optimizer's states in their order, each as little-endian
// float32.
func stateDigest(spec Spec, st map[string][][]float32) string {
	h := sha256.New()
	for _, n := range spec.ParamNames() {
		for _, v := range st[n] {
			h.Write(buffers.AsBytes(v))
		}
	}
	return hex.EncodeToString(h.Sum(nil))
}

// recoverUpdate implements updateRecoverer for this process's rank.
func (b *distBackend) recoverUpdate(ctx context.Context, retry func(error) bool) error {
	if err := retryFailedUpdate(ctx, b.rt, retry); err != nil {
		return err
	}
	if len(b.infos) > 0 {
		b.infos[len(b.infos)-1] = b.rt.LastStep()
	}
	return nil
}

package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"iter"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/gomlx/compute"
	"github.com/gomlx/compute/dtypes"
	"github.com/gomlx/compute/shapes"
	"github.com/gomlx/gomlx/core/tensors"
	"github.com/gomlx/gomlx/ml/layers"
	"github.com/gomlx/gomlx/ml/model"
	"github.com/gomlx/gomlx/ml/train"
	"github.com/gomlx/gomlx/ml/zoo/transformer"

	"github.com/zinfio/zinf"
	"github.com/zinfio/zinf/config"
	zgomlx "github.com/zinfio/zinf/contrib/gomlx"
	"github.com/zinfio/zinf/contrib/gomlx/reference"
	"github.com/zinfio/zinf/internal/base/yield"
	"github.com/zinfio/zinf/metrics/procstat"
	"github.com/zinfio/zinf/metrics/stats"
)

// big trains one zoo transformer whose training state may exceed the
// machine's RAM (make bench-llm-big): created layer by layer straight
// into zinf (zgomlx.Create: one layer's values in memory at a time),
// every weight, master, Adam moment and gradient on NVMe, trained by
// zgomlx.Loop under gradient_accumulation_steps "auto" layer-major:
// zgomlx.AutoMeasureSteps warm-up steps at the plan's k, then o.steps
// timed steps at the planner's k (the micro-batches whose compute covers
// the step's NVMe I/O). After each timed step a child process trains a
// slice of the same model in memory (sliceChild: -slice-blocks of the
// same blocks, the embedding and the head, at the same micro-batch shape
// and k) whose time, scaled to every block, is the in-memory compute
// rate the offloaded step is compared with. Each step reports tokens/s
// both ways and their ratio, peak RSS against pinned pool + activations
// + 512 MiB, the NVMe bytes against the plan's prediction, and the busy
// share of the disk holding o.dir (/proc/diskstats io_ticks); a summary
// block of medians (min..max) ends the run.
func big(o options, w io.Writer) error {
	ctx := context.Background()
	start := time.Now()
	b, err := compute.NewWithConfig(zgomlx.DefaultBackend)
	if err != nil {
		return err
	}
	heads, ffn := bigShape(o)
	store := model.NewStore()
	store.SetParam(model.ParamInitialSeed, int64(1))
	m := transformer.New(store.RootScope()).WithVocabSize(o.vocab).WithEmbedDim(o.dim).WithNumLayers(o.layers).
		WithNumHeads(heads).WithHeadDim(o.dim / heads).WithFFNDim(ffn).WithRoPE(10000).WithFinalNormalization(layers.NormalizationRMSNorm)
	net, err := zgomlx.TransformerNet(m, zgomlx.TransformerOptions{TieEmbeddings: o.tied, HeadBlockRows: o.headRows})
	if err != nil {
		return err
	}
	// The parameters by formula, before anything is allocated: the
	// embedding, per block 4 d^2 attention + 2 d ffn + the ffn's and
	// norms' vectors (counted after Create), the untied head.
	estParams := int64(o.vocab)*int64(o.dim) + int64(o.layers)*(4*int64(o.dim)*int64(o.dim)+2*int64(o.dim)*int64(ffn))
	if !o.tied {
		estParams += int64(o.vocab) * int64(o.dim)
	}
	head := map[bool]string{true: "tied (the head reads the embedding table)", false: "untied"}[o.tied]
	if o.headRows > 0 {
		head = fmt.Sprintf("tied, computed in blocks of %d rows of the table (HeadBlockRows)", o.headRows)
	}
	fmt.Fprintf(w, "bench-llm-big: GoMLX zoo transformer (ml/zoo/transformer), %d layers, d=%d, %d heads x %d, ffn %d, RoPE, RMS final norm, vocab %d, %s head; about %.3f B parameters, %.1f GiB of state at 20 bytes each; batch %d x %d tokens, %d steps\n",
		o.layers, o.dim, heads, o.dim/heads, ffn, o.vocab, head, float64(estParams)/1e9, float64(estParams*20)/(1<<30), o.batch, o.seq, o.steps)
	fmt.Fprintf(w, "machine: GOMAXPROCS %d, %d CPUs, %.1f GiB RAM, %.1f GiB free on %s; load average %s\n",
		runtime.GOMAXPROCS(0), runtime.NumCPU(), float64(procstat.MemTotal())/(1<<30), float64(freeBytes(o.dir))/(1<<30), o.dir, loadavg())

	cfg := config.Default()
	dir, err := os.MkdirTemp(o.dir, "zinf-benchllm-big-")
	if err != nil {
		return err
	}
	defer func() {
		if err := os.RemoveAll(dir); err == nil {
			fmt.Fprintf(w, "deleted the swap files (%s)\n", dir)
		}
	}()
	cfg.SetScratchDir(dir)
	cfg.ZeroOptimization.OffloadParam.MaxInCPU = 0
	cfg.ZeroOptimization.SubGroupSize = int64(o.subgroup)
	cfg.Optimizer.LR = 0.005
	// The planner's k (gradient_accumulation_steps "auto", item 2 of the
	// loop's design): AutoMeasureSteps steps at the plan's k, then the k
	// whose compute covers the step's NVMe I/O. Layer-major: one read of
	// the weights per pass serves every micro-batch. A Net.Head (-tied
	// -head-rows) runs layer-major too: one read of the table's blocks per
	// pass serves every micro-batch, and no buffer of the table's size is
	// filled in Go memory.
	cfg.GradientAccumulationAuto = true
	cfg.Zinf.Schedule = config.ScheduleLayerMajor
	// The simulated device's tier holds no tensor here (the executors run
	// on the CPU, from the adapter's Go buffers); it only has to admit
	// the planner's working set (two layers of parameters and one of
	// gradients; the largest layer may be the vocab x dim table, which
	// with few blocks outweighs the rest): room for all of them.
	table := 4 * int64(o.vocab) * int64(o.dim)
	cfg.Zinf.Tiers.GPUBytes = config.Size(4*estParams + 3*table + 1<<30)
	cfg.Zinf.Tiers.CPUPinnedBytes = config.Size(o.pinned)
	o.applyZinf(cfg)
	xs := shapes.Make(dtypes.Int32, o.batch, o.seq)
	if o.pinned == 0 {
		// The least zinf plans for this model (its pool-too-small error
		// says), plus room to fetch the next two layers while one
		// computes, as make demo-llm sizes it.
		c := *cfg
		c.Zinf.Tiers.CPUPinnedBytes = 1
		tmp := model.NewStore()
		tmp.SetParam(model.ParamInitialSeed, int64(1))
		mt := transformer.New(tmp.RootScope()).WithVocabSize(o.vocab).WithEmbedDim(o.dim).WithNumLayers(o.layers).
			WithNumHeads(heads).WithHeadDim(o.dim / heads).WithFFNDim(ffn).WithRoPE(10000).WithFinalNormalization(layers.NormalizationRMSNorm)
		nt, err := zgomlx.TransformerNet(mt, zgomlx.TransformerOptions{TieEmbeddings: o.tied, HeadBlockRows: o.headRows})
		if err != nil {
			return err
		}
		tr, err := zgomlx.Create(ctx, b, &c, tmp, nt, zgomlx.Options{}, xs)
		var small *zinf.PoolTooSmallError
		if err == nil {
			tr.Close()
			return fmt.Errorf("a 1-byte pinned pool was accepted: set -pinned")
		} else if !errors.As(err, &small) {
			return err
		}
		o.pinned = small.Res.MinPoolBytes + 2*small.Res.ParamDemandBytes
		fmt.Fprintf(w, "pinned pool: plan minimum %.0f MiB + 2 x the largest layer's parameter demand %.0f MiB = %.0f MiB\n",
			float64(small.Res.MinPoolBytes)/(1<<20), float64(small.Res.ParamDemandBytes)/(1<<20), float64(o.pinned)/(1<<20))
		cfg.Zinf.Tiers.CPUPinnedBytes = config.Size(o.pinned)
	}

	r0, w0, _ := procstat.IO()
	t0 := time.Now()
	credit := zgomlx.AutoHeapCredit
	if o.credit == "none" {
		credit = zgomlx.NoHeapCredit
	}
	tr, err := zgomlx.Create(ctx, b, cfg, store, net, zgomlx.Options{HeapCredit: credit, OneLayerResident: o.oneLayer, ReadAheadTables: o.readAhead}, xs)
	if err != nil {
		return err
	}
	defer tr.Close()
	off := tr.Offload()
	rt := off.Runtime()
	if o.overlap && !rt.OverlapUpdate() {
		return fmt.Errorf("-overlap-update: the runtime does not overlap the update (plan: overlap step %v)", rt.Placement().OverlapStep)
	}
	fmt.Fprintf(w, "zinf.overlap_update %v (-overlap-update), read-ahead of the tables %v (-read-ahead), checksums %v (-checksums)\n", rt.OverlapUpdate(), o.readAhead, o.checksums)
	var params int64
	for _, v := range off.Vars() {
		params += int64(v.Shape.Size())
	}
	r1, w1, _ := procstat.IO()
	createPeak := procstat.PeakRSS()
	ram := procstat.MemTotal()
	fmt.Fprintf(w, "created layer by layer into zinf in %s: %d parameters (%.3f B) in %d tensors; training state %.2f GiB on NVMe (params, fp32 masters, Adam moments, gradients), %.2fx this machine's RAM; disk written %.2f GiB, read %.2f GiB; peak RSS while creating %.0f MiB\n",
		time.Since(t0).Round(time.Second), params, float64(params)/1e9, len(off.Vars()), float64(off.StateBytes())/(1<<30), float64(off.StateBytes())/float64(ram),
		float64(w1-w0)/(1<<30), float64(r1-r0)/(1<<30), float64(createPeak)/(1<<20))

	hc, hcs := off.HeapCredit()
	fmt.Fprintf(w, "heap credit (-heap-credit %s): %.0f MiB, %s\n", o.credit, float64(hc)/(1<<20), hcs)
	if o.oneLayer {
		fmt.Fprintf(w, "swap-ins (-one-layer): one layer's weights and gradients in Go memory at a time (zgomlx.Options.OneLayerResident)\n")
	} else {
		fmt.Fprintf(w, "swap-ins: the next layer's while a layer computes, its gradients handed over during the next backward (two layers' of each in Go memory)\n")
	}
	pl := rt.Placement()
	pr := pl.Predicted
	predBytes := pr.NVMeReadBytes + pr.NVMeWriteBytes
	fmt.Fprintf(w, "plan (rt.Plan): schedule %s, %d micro-batches a step until the compute is measured; predicted step %.1f s (compute unknown: a disk-bound prediction); NVMe per step read %.2f GiB, written %.2f GiB (layer-major: the same for every k); prefetch %d layers; pinned pool %.0f MiB; bandwidth %s\n",
		rt.Schedule(), rt.MicroBatches(), pr.Total.Seconds(), float64(pr.NVMeReadBytes)/(1<<30), float64(pr.NVMeWriteBytes)/(1<<30), pl.PrefetchDepth, float64(o.pinned)/(1<<20),
		bwLine(rt.Bandwidth().ReadBps(), rt.Bandwidth().WriteBps()))
	optOpts := rt.Optimizer.Options()
	fmt.Fprintf(w, "optimizer: sub-groups of %d elements, pipeline depth %d, %d buffer sets (zinf.pipeline_depth %s)\n",
		optOpts.SubGroupSize, optOpts.PipelineDepth, optOpts.BufferCount, map[bool]string{true: "\"auto\"", false: "as set"}[rt.Config.Zinf.PipelineDepthAuto])
	disk := diskOf(o.dir)
	fmt.Fprintf(w, "disk busy share from /proc/diskstats io_ticks of %s\n", disk)

	var trainLim int64
	if o.trainLimit != "" {
		lim, err := config.ParseSize(o.trainLimit)
		if err != nil || lim <= 0 {
			return fmt.Errorf("-train-memlimit %q: want a size such as 1600MiB (%v)", o.trainLimit, err)
		}
		trainLim = lim
		prev := debug.SetMemoryLimit(lim)
		fmt.Fprintf(w, "Go memory limit while training (-train-memlimit): %.0f MiB (creating: %.0f MiB)\n", float64(lim)/(1<<20), float64(prev)/(1<<20))
	}
	debug.FreeOSMemory()
	procstat.ResetPeakRSS() // the peak covers training
	var ms0 runtime.MemStats
	runtime.ReadMemStats(&ms0)
	gc0 := ms0.NumGC
	tokens := int64(o.batch * o.seq)
	loop := zgomlx.NewLoop(tr)
	next := 0
	ds := bigDataset{o: o, next: &next}
	lm := rt.Schedule() == zinf.LayerMajor

	// measure runs one step of the loop and what it moved.
	type stepStat struct {
		k                   int
		loss                float32
		wall, compute       time.Duration
		read, written       int64 // the stores' logical bytes
		devRead, devWritten int64 // the stores' device requests
		busy                float64
		rssBefore, rssAfter int64
		// The parameters' share of the reads: swap-ins, and the
		// prefetched bytes the pool sent back before use (read again).
		paramRead, preempted int64
		demandMisses         int64
		// The executors' compute per block (the blocks' forward and
		// backward calls over the step's k micro-batches), and the rest
		// of the compute (the embedding, the head, the loss).
		blockMs []float64
		restMs  float64
		// cpu is the process's CPU time (user and system) over the step.
		cpu time.Duration
		// tail is optimizerTail of the step's update.
		tail string
	}
	measure := func() (stepStat, error) {
		st := stepStat{k: loop.MicroBatchesPerStep(), rssBefore: procstat.RSS()}
		m0 := rt.Metrics()
		tm0 := tr.Timings()
		c0, lc0 := tm0.Compute, tm0.LayerCompute
		d0, dok := disk.ioTicks()
		cpu0 := cpuTime()
		t0 := time.Now()
		loss, err := loop.RunSteps(ctx, ds, 1)
		st.wall = time.Since(t0)
		st.cpu = cpuTime() - cpu0
		if err != nil {
			return st, err
		}
		d1, _ := disk.ioTicks()
		m1 := rt.Metrics()
		tm1 := tr.Timings()
		st.loss, st.compute = loss, tm1.Compute-c0
		st.restMs = float64(st.compute) / 1e6
		for l := 1; l <= o.layers && l < len(tm1.LayerCompute); l++ {
			d := float64(tm1.LayerCompute[l]-lc0[l]) / 1e6
			st.blockMs = append(st.blockMs, d)
			st.restMs -= d
		}
		st.read, st.written = m1.BytesRead-m0.BytesRead, m1.BytesWritten-m0.BytesWritten
		st.devRead, st.devWritten = m1.DeviceBytesRead-m0.DeviceBytesRead, m1.DeviceBytesWritten-m0.DeviceBytesWritten
		st.paramRead, st.preempted = m1.Params.BytesRead-m0.Params.BytesRead, m1.Params.PreemptedBytes-m0.Params.PreemptedBytes
		st.demandMisses = m1.Schedule.DemandMisses - m0.Schedule.DemandMisses
		st.busy = math.NaN()
		if dok {
			st.busy = float64(d1-d0) / float64(st.wall.Milliseconds())
		}
		st.rssAfter = procstat.RSS()
		if !o.overlap { // with zinf.overlap_update the last update is the step before's
			st.tail = optimizerTail(m1.Optimizer.Last)
		}
		return st, nil
	}
	line := func(what string, st stepStat) {
		tok := float64(int64(st.k) * tokens)
		fmt.Fprintf(w, "%s  k=%d  loss %.4f  %.1f s (compute %.1f s: %s ms a block, the rest %.1f s; CPU %.1f s, %.2f cores)  %.2f tokens/s  NVMe read %.2f GiB (%+.1f%% of the plan's) written %.2f GiB (%+.1f%%), together %+.1f%% of the plan's %.2f GiB; device requests %.2f / %.2f GiB; parameters read %.2f GiB (%.2f GiB of them prefetched and sent back before use, %d demand misses)  disk busy %s  RSS %.0f MiB before, %.0f after  load %s\n",
			what, st.k, st.loss, st.wall.Seconds(), st.compute.Seconds(), medRange(st.blockMs, "%.1f"), st.restMs/1e3, st.cpu.Seconds(), st.cpu.Seconds()/st.wall.Seconds(), tok/st.wall.Seconds(),
			float64(st.read)/(1<<30), 100*(float64(st.read)/float64(pr.NVMeReadBytes)-1), float64(st.written)/(1<<30), 100*(float64(st.written)/float64(pr.NVMeWriteBytes)-1),
			100*(float64(st.read+st.written)/float64(predBytes)-1), float64(predBytes)/(1<<30), float64(st.devRead)/(1<<30), float64(st.devWritten)/(1<<30),
			float64(st.paramRead)/(1<<30), float64(st.preempted)/(1<<30), st.demandMisses, pct(st.busy), float64(st.rssBefore)/(1<<20), float64(st.rssAfter)/(1<<20), loadavg())
		if st.tail != "" {
			fmt.Fprintf(w, "  %s\n", st.tail)
		}
	}
	for i := range zgomlx.AutoMeasureSteps {
		st, err := measure()
		if err != nil {
			return fmt.Errorf("warm-up step %d: %w", i+1, err)
		}
		line(fmt.Sprintf("warm-up %d/%d (the plan's k; compiles, measures the compute)", i+1, zgomlx.AutoMeasureSteps), st)
	}
	k := loop.MicroBatchesPerStep()
	// The executors' compute of the warm-up steps by pass, per layer and
	// micro-batch (both steps ran the plan's k).
	wt := tr.Timings()
	warmUnits := time.Duration(zgomlx.AutoMeasureSteps * rt.MicroBatches() * rt.Layers())
	cover := rt.MicroBatchesToHideIOPasses(wt.ForwardCompute/warmUnits, wt.BackwardCompute/warmUnits)
	fmt.Fprintf(w, "the timed steps run k=%d %s: the planner's k that zgomlx.Loop took under \"auto\" from its executors' compute by pass in the last warm-up step; at both warm-up steps' the planner says %s (the runtime's own measure of its layer visits, %.0f ms per layer, pass and micro-batch, which counts the loop's work while a layer is begun, says %s)\n",
		k, map[bool]string{true: "layer-major", false: "micro-batch-major"}[lm], cover, float64(rt.MeasuredComputePerLayer())/1e6, rt.MicroBatchesToHideIO(0))

	exe, err := os.Executable()
	if err != nil {
		return err
	}
	// Activations the loop keeps: every layer's input [batch, seq, d]
	// (fp32) of every micro-batch until its backward (in memory: the
	// activation tier's default), and the logits [batch, seq, vocab]: a
	// layer-major step holds every micro-batch's until its loss, their
	// gradients after it (k + 1 at most at once).
	acts := int64(k)*(int64(o.layers)+2)*tokens*int64(o.dim)*4 + int64(k+1)*tokens*int64(o.vocab)*4
	bound := o.pinned + acts + 512<<20
	if trainLim > 0 {
		// The activations live in the Go heap, and the bound counts them:
		// the timed steps' limit is -train-memlimit plus them. At a fixed
		// limit the collector had the less room the larger the planner's
		// k: about 41 cycles a step at k=8, about 160 at k=11 (124 blocks,
		// 330 MiB), each one marking the live heap on the model's cores.
		debug.SetMemoryLimit(trainLim + acts)
		fmt.Fprintf(w, "Go memory limit for the timed steps: %.0f MiB (-train-memlimit) + %.1f MiB of activations at k=%d = %.0f MiB\n", float64(trainLim)/(1<<20), float64(acts)/(1<<20), k, float64(trainLim+acts)/(1<<20))
	}

	var steps []stepStat
	var memTokS, ratios []float64
	var tm0 = tr.Timings()
	// slice runs the in-memory slice child at the timed steps' k and
	// compares the offloaded step st with it.
	slice := func(st stepStat) error {
		var sr sliceResult
		t0 := time.Now()
		if err := procstat.RunChild(exe, sliceArgs(o, k), &sr); err != nil {
			return err
		}
		est := sr.estimate(o.layers)
		tok := float64(int64(k)*tokens) / est.Seconds()
		offTok := float64(int64(k)*tokens) / st.wall.Seconds()
		memTokS, ratios = append(memTokS, tok), append(ratios, offTok/tok)
		fmt.Fprintf(w, "  in memory (a child: %d blocks + embedding + head, k=%d, medians of %d steps, %.1f s in all): step %.2f s (CPU %.2f s, %.2f cores), its executors' compute %.2f s (%s ms a block, the rest %.1f s) -> %d blocks (each step's blocks' mean for the blocks it lacks, the median over its steps): compute %.1f s, %.2f tokens/s; offloaded / in memory %.3f  load %s\n",
			sr.Blocks, k, sliceSteps, time.Since(t0).Seconds(), sr.WallMs/1e3, stats.Median(sr.StepCPUMs)/1e3, stats.Median(sr.StepCPUMs)/sr.WallMs, sr.ComputeMs/1e3, medRange(sr.BlockMs, "%.1f"), sr.restMs()/1e3, o.layers, est.Seconds(), tok, offTok/tok, loadavg())
		return nil
	}
	// The in-memory slices run between two offloaded steps, except with
	// zinf.overlap_update: there a step's update goes on after the step
	// returns, and a child run beside it would take its I/O out of every
	// step's window (and its CPU work into the child's), so the timed steps
	// run back to back, each window holding the update of the step before
	// (a loop's steady state), and the slices after the last one's update.
	stopProfile, err := startCPUProfile(o.cpuProfile)
	if err != nil {
		return err
	}
	for s := range o.steps {
		st, err := measure()
		if err != nil {
			return fmt.Errorf("step %d: %w", s+1, err)
		}
		steps = append(steps, st)
		line(fmt.Sprintf("step %d/%d", s+1, o.steps), st)
		if o.overlap {
			continue
		}
		if err := slice(st); err != nil {
			return fmt.Errorf("in-memory slice after step %d: %w", s+1, err)
		}
	}
	if o.overlap {
		if err := rt.WaitStep(ctx); err != nil {
			return fmt.Errorf("the last timed step's update: %w", err)
		}
	}
	if err := stopProfile(); err != nil {
		return fmt.Errorf("-cpuprofile: %w", err)
	}
	if o.overlap {
		for s, st := range steps {
			if err := slice(st); err != nil {
				return fmt.Errorf("in-memory slice %d (after the timed steps, -overlap-update): %w", s+1, err)
			}
		}
	}
	if o.contend != "" {
		if err := contentionProbe(o, exe, k, w); err != nil {
			return err
		}
	}
	if o.memProfile != "" {
		if err := writeHeapProfile(o.memProfile); err != nil {
			return fmt.Errorf("-memprofile: %w", err)
		}
		fmt.Fprintf(w, "heap profile (-memprofile): %s\n", o.memProfile)
	}
	tm := tr.Timings()
	peak := procstat.PeakRSS()
	met := rt.Metrics()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	per := func(d time.Duration) float64 { return d.Seconds() / float64(o.steps) }
	fmt.Fprintf(w, "\nzinf calls of the loop per timed step: swap-in %.1f s, gradients %.1f s, update start %.1f s, commit %.1f s (the first three overlap compute); runtime's measured compute per layer, pass and micro-batch %.0f ms\n",
		per(tm.SwapIn-tm0.SwapIn), per(tm.Grads-tm0.Grads), per(tm.StepLayer-tm0.StepLayer), per(tm.Commit-tm0.Commit), float64(rt.MeasuredComputePerLayer())/1e6)
	fmt.Fprintf(w, "Go heap at the end: in use %.0f MiB, idle not returned %.0f MiB, GC cycles %d while training (%d in all); swap-in buffers %.0f MiB; pinned peak %.0f MiB of %.0f MiB\n",
		float64(ms.HeapInuse)/(1<<20), float64(ms.HeapIdle-ms.HeapReleased)/(1<<20), ms.NumGC-gc0, ms.NumGC, float64(tr.SwapBufferBytes())/(1<<20),
		float64(met.PinnedPeakBytes)/(1<<20), float64(met.PinnedBytes)/(1<<20))

	// The summary, as BENCHMARKS.md takes it.
	col := func(f func(stepStat) float64) []float64 {
		v := make([]float64, len(steps))
		for i, st := range steps {
			v[i] = f(st)
		}
		return v
	}
	tokOff := col(func(st stepStat) float64 { return float64(int64(st.k)*tokens) / st.wall.Seconds() })
	nvme := col(func(st stepStat) float64 { return float64(st.read + st.written) })
	dev := col(func(st stepStat) float64 {
		return 100 * (float64(st.read+st.written)/float64(predBytes) - 1)
	})
	maxDev := slices.MaxFunc(dev, func(a, b float64) int { return cmpAbs(a, b) })
	busy := col(func(st stepStat) float64 { return 100 * st.busy })
	verdict := func(ok bool) string { return map[bool]string{true: "met", false: "NOT met"}[ok] }
	fmt.Fprintf(w, "\nsummary: medians over %d timed steps (min..max); load average at the end %s; %s in all\n", o.steps, loadavg(), time.Since(start).Round(time.Second))
	fmt.Fprintf(w, "| bench-llm-big (%s) | |\n|---|---|\n", buildLine())
	fmt.Fprintf(w, "| model | zoo transformer, %d blocks, d=%d, ffn %d, vocab %d, %s head; %.3f B parameters; state %.2f GiB = %.2fx RAM (%.1f GiB) |\n",
		o.layers, o.dim, ffn, o.vocab, map[bool]string{true: "tied", false: "untied"}[o.tied], float64(params)/1e9, float64(off.StateBytes())/(1<<30), float64(off.StateBytes())/float64(ram), float64(ram)/(1<<30))
	fmt.Fprintf(w, "| micro-batches | k=%d (%s, gradient_accumulation_steps \"auto\"), %d x %d tokens each |\n", k, map[bool]string{true: "layer-major", false: "micro-batch-major"}[lm], o.batch, o.seq)
	fmt.Fprintf(w, "| offloaded step | %s s |\n", medRange(col(func(st stepStat) float64 { return st.wall.Seconds() }), "%.1f"))
	fmt.Fprintf(w, "| offloaded tokens/s | %s |\n", medRange(tokOff, "%.2f"))
	fmt.Fprintf(w, "| in-memory compute-bound tokens/s (the executors' compute of %d blocks + embedding + head in memory, scaled to %d blocks) | %s |\n", o.sliceBlocks, o.layers, medRange(memTokS, "%.2f"))
	fmt.Fprintf(w, "| offloaded / in memory | %s (bar >= 0.9: %s); the ratio of the two medians %.3f |\n", medRange(ratios, "%.3f"), verdict(stats.Median(ratios) >= 0.9), stats.Median(tokOff)/stats.Median(memTokS))
	swap := tr.SwapBufferBytes()
	fmt.Fprintf(w, "| peak RSS (VmHWM, training) | %.0f MiB against pinned pool %.0f + activations %.1f + 512 = %.0f MiB (%s); the adapter's Go swap-in buffers (the largest layers' shapes) are %.0f MiB more |\n",
		float64(peak)/(1<<20), float64(o.pinned)/(1<<20), float64(acts)/(1<<20), float64(bound)/(1<<20), verdict(peak <= bound), float64(swap)/(1<<20))
	rd := col(func(st stepStat) float64 { return 100 * (float64(st.read)/float64(pr.NVMeReadBytes) - 1) })
	wr := col(func(st stepStat) float64 { return 100 * (float64(st.written)/float64(pr.NVMeWriteBytes) - 1) })
	fmt.Fprintf(w, "| NVMe per step (read + written) | %s GiB against the plan's %.2f GiB: %s%% (read %s%%, written %s%%; bar within 3%%: %s) |\n",
		medRange(scale(nvme, 1.0/(1<<30)), "%.2f"), float64(predBytes)/(1<<30), medRange(dev, "%+.1f"), medRange(rd, "%+.1f"), medRange(wr, "%+.1f"), verdict(math.Abs(maxDev) <= 3))
	if !o.tied {
		// Part of what the plan counts and a loop reading the embedding
		// table by rows need not move: the table whole for the forward
		// pass (the loop reads its batch's rows) and for the backward (a
		// lookup's backward needs no weights), and its gradient read back
		// by the optimizer (taken from the pinned copy just handed over,
		// the backward's last). Said beside the bar's figure, not in its
		// place; at 6 blocks, d=256 it was the whole difference, at 4
		// blocks, d=1024 not (-6.5% left).
		table := 4 * int64(o.vocab) * int64(o.dim)
		adj := col(func(st stepStat) float64 { return 100 * (float64(st.read+st.written)/float64(predBytes-3*table) - 1) })
		fmt.Fprintf(w, "| NVMe per step against the plan less 3 x the table (%.2f GiB: its whole reads for both passes and its gradient's read-back, which a loop reading it by rows need not make) | %s%% |\n",
			float64(3*table)/(1<<30), medRange(adj, "%+.1f"))
	}
	fmt.Fprintf(w, "| disk busy share (%s) | %s%% |\n", disk.name, medRange(busy, "%.0f"))
	cpu := col(func(st stepStat) float64 { return st.cpu.Seconds() })
	fmt.Fprintf(w, "| CPU per offloaded step (user + system) | %s s, %s of the machine's %d cores |\n",
		medRange(cpu, "%.1f"), medRange(col(func(st stepStat) float64 { return st.cpu.Seconds() / st.wall.Seconds() }), "%.2f"), runtime.NumCPU())
	return nil
}

// writeHeapProfile writes the live heap's profile, after a collection,
// to path.
// startCPUProfile starts the CPU profile to path ("": none) and returns
// the function that ends it and closes the file.
func startCPUProfile(path string) (stop func() error, err error) {
	if path == "" {
		return func() error { return nil }, nil
	}
	f, err := os.Create(path)
	if err != nil {
		return nil, fmt.Errorf("-cpuprofile: %w", err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, fmt.Errorf("-cpuprofile: %w", err)
	}
	return func() error {
		pprof.StopCPUProfile()
		return f.Close()
	}, nil
}

func writeHeapProfile(path string) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	runtime.GC()
	if err := pprof.WriteHeapProfile(f); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// bigDataset is the -big run's train.Dataset: batch(o, i) for i = 0, 1,
// ... across RunSteps calls (next counts them), without end.
type bigDataset struct {
	o    options
	next *int
}

func (d bigDataset) Name() string { return "synthetic" }

func (d bigDataset) Iter() iter.Seq2[train.Batch, error] {
	return func(yield func(train.Batch, error) bool) {
		for {
			x, y := batch(d.o, *d.next)
			*d.next++
			if !yield(train.Batch{Inputs: []*tensors.Tensor{x}, Labels: []*tensors.Tensor{y}}, nil) {
				return
			}
		}
	}
}

// sliceResult is what an in-memory slice child reports, in ms: its timed
// steps' median wall and compute, each block's compute in each step, and
// each step's compute and its blocks' part of it.
type sliceResult struct {
	Blocks    int       `json:"blocks"`
	WallMs    float64   `json:"wall_ms"`
	ComputeMs float64   `json:"compute_ms"`
	BlockMs   []float64 `json:"block_ms"`
	// StepMs is each timed step's compute, StepBlocksMs its blocks' sum.
	StepMs       []float64 `json:"step_ms"`
	StepBlocksMs []float64 `json:"step_blocks_ms"`
	// StepCPUMs is each timed step's CPU time (user and system).
	StepCPUMs []float64 `json:"step_cpu_ms"`
	PeakRSS   int64     `json:"peak_rss"`
}

func (r sliceResult) blockMs() float64 { return stats.Median(r.BlockMs) }

// restMs is the median over the steps of their compute besides the
// blocks' (the embedding, the head, the loss).
func (r sliceResult) restMs() float64 {
	if len(r.StepMs) == 0 || len(r.StepMs) != len(r.StepBlocksMs) {
		return r.ComputeMs - float64(r.Blocks)*r.blockMs()
	}
	rest := make([]float64, len(r.StepMs))
	for i := range rest {
		rest[i] = r.StepMs[i] - r.StepBlocksMs[i]
	}
	return stats.Median(rest)
}

// estimate is the in-memory compute-bound step of the whole model at the
// slice's shape and k: for each timed step of the slice, its executors'
// compute (every micro-batch's forward, loss and backward of the
// embedding, its blocks and the head) plus, for every block it lacks,
// the mean of its blocks' compute in that step; the median over its
// steps. The mean, not the median of the blocks, because the offloaded
// step it is compared with is the sum of its blocks' compute, slow ones
// included; each step scaled on its own, because what slows a step (a
// GC cycle, the machine) slows its blocks together. A block's compute
// swings 330-640 ms from one to the next on this machine (in memory and
// offloaded alike), so the median of a 2-block slice's six blocks moved
// the estimate by 15% from one child to the next.
//
// The in-memory optimizer's time (Adam in Go over every weight) is left
// out: the rate is the arithmetic's, the fastest in-memory training could
// go, and the ratio against it errs low.
func (r sliceResult) estimate(layers int) time.Duration {
	if len(r.StepMs) == 0 || len(r.StepMs) != len(r.StepBlocksMs) || r.Blocks <= 0 {
		return time.Duration((r.ComputeMs + float64(layers-r.Blocks)*r.blockMs()) * 1e6)
	}
	est := make([]float64, len(r.StepMs))
	for i, c := range r.StepMs {
		est[i] = c + float64(layers-r.Blocks)*r.StepBlocksMs[i]/float64(r.Blocks)
	}
	return time.Duration(stats.Median(est) * 1e6)
}

// sliceSteps is the timed steps of an in-memory slice child. One was too
// few: a block's compute in one step of a 2-block slice swung 452-707 ms
// between three children of one run (the in-memory Adam of a layer runs
// beside the next layer's compute, and a GC cycle lands where it lands),
// which moved the in-memory estimate by half; three moved it by 15%.
// The child reports every step; the estimate is their median.
const sliceSteps = 5

// sliceArgs are the arguments of the in-memory slice child after an
// offloaded step of k micro-batches.
func sliceArgs(o options, k int) []string {
	return []string{"-child", "slice", "-layers", strconv.Itoa(o.sliceBlocks), "-dim", strconv.Itoa(o.dim), "-heads", strconv.Itoa(o.heads),
		"-ffn", strconv.Itoa(o.ffn), "-vocab", strconv.Itoa(o.vocab), "-tied=" + strconv.FormatBool(o.tied), "-batch", strconv.Itoa(o.batch),
		"-seq", strconv.Itoa(o.seq), "-k", strconv.Itoa(k), "-steps", strconv.Itoa(sliceSteps), "-warm", "1"}
}

// sliceChild trains o.layers blocks of the -big model (with its
// embedding and head) in Go memory (reference.MemoryTrainer: the same
// per-layer executors, zinf's Adam) at o.k micro-batches a step: o.warm
// untimed steps, then o.steps timed, their medians printed as JSON. A tied model's head is
// one product over the table (the blocked head, -head-rows, has no
// in-memory trainer): the same arithmetic.
func sliceChild(o options, w io.Writer) error {
	// The parent's GOMEMLIMIT is sized for its streamed state, not for a
	// slice held whole: no limit here.
	debug.SetMemoryLimit(math.MaxInt64)
	ctx := context.Background()
	b, err := compute.NewWithConfig(zgomlx.DefaultBackend)
	if err != nil {
		return err
	}
	heads, ffn := bigShape(o)
	store := model.NewStore()
	store.SetParam(model.ParamInitialSeed, int64(1))
	m := transformer.New(store.RootScope()).WithVocabSize(o.vocab).WithEmbedDim(o.dim).WithNumLayers(o.layers).
		WithNumHeads(heads).WithHeadDim(o.dim / heads).WithFFNDim(ffn).WithRoPE(10000).WithFinalNormalization(layers.NormalizationRMSNorm)
	net, err := zgomlx.TransformerNet(m, zgomlx.TransformerOptions{TieEmbeddings: o.tied})
	if err != nil {
		return err
	}
	if _, err := zgomlx.Initialize(b, store, net, shapes.Make(dtypes.Int32, o.batch, o.seq)); err != nil {
		return err
	}
	cfg := config.Default()
	cfg.Optimizer.LR = 0.005
	mt, err := reference.NewMemoryTrainer(b, store, net, cfg, zgomlx.Options{})
	if err != nil {
		return err
	}
	defer mt.Close()
	n := 0
	step := func() error {
		for i := range o.k {
			x, y := batch(o, n)
			n++
			var err error
			if i < o.k-1 {
				_, err = mt.Accumulate(ctx, x, y)
			} else {
				_, err = mt.Step(ctx, x, y)
			}
			if err != nil {
				return err
			}
		}
		return nil
	}
	if o.contendWith != "" {
		// Beside the warm-up steps too: the load's start is not timed.
		stop := contend(o.contendWith)
		defer stop()
	}
	for range o.warm {
		if err := step(); err != nil {
			return err
		}
	}
	res := sliceResult{Blocks: o.layers}
	var walls, computes []float64
	stopProfile, err := startCPUProfile(o.cpuProfile)
	if err != nil {
		return err
	}
	for range o.steps {
		tm0 := mt.Timings()
		cpu0 := cpuTime()
		t0 := time.Now()
		if err := step(); err != nil {
			return err
		}
		walls = append(walls, float64(time.Since(t0))/1e6)
		res.StepCPUMs = append(res.StepCPUMs, float64(cpuTime()-cpu0)/1e6)
		tm := mt.Timings()
		computes = append(computes, float64(tm.Compute-tm0.Compute)/1e6)
		// TransformerNet's layers: the embedding, the blocks, the head.
		var sum float64
		for l := 1; l <= o.layers && l < len(tm.LayerCompute); l++ {
			d := float64(tm.LayerCompute[l]-tm0.LayerCompute[l]) / 1e6
			res.BlockMs = append(res.BlockMs, d)
			sum += d
		}
		res.StepMs, res.StepBlocksMs = append(res.StepMs, computes[len(computes)-1]), append(res.StepBlocksMs, sum)
	}
	if err := stopProfile(); err != nil {
		return err
	}
	// The medians of the timed steps (a block's: over every block of
	// every step).
	res.WallMs, res.ComputeMs, res.PeakRSS = stats.Median(walls), stats.Median(computes), procstat.PeakRSS()
	return jsonOut(w, res)
}

// contend runs load on one goroutine until the function it returns is
// called (which waits for it to stop): cpu, a floating-point loop; mem,
// copies between two 256 MiB buffers; cpu-paced and mem-paced, the same
// with a yield point between chunks of about 100 µs, as zinf's own
// background work has (zinf.BeginCompute).
func contend(load string) (stop func()) {
	var quit atomic.Bool
	done := make(chan struct{})
	kind, paced := strings.CutSuffix(load, "-paced")
	var a, b []byte
	if kind == "mem" {
		a, b = make([]byte, 256<<20), make([]byte, 256<<20)
		for i := range a {
			a[i] = byte(i)
		}
		copy(b, a) // the pages faulted in before the timed steps
	}
	point := func() {
		if paced {
			yield.Point()
		}
	}
	go func() {
		defer close(done)
		switch kind {
		case "mem":
			// In 1 MiB copies: a copy is not preempted, and a long one
			// would hold its processor from the compute's goroutines.
			for !quit.Load() {
				for i := 0; i < len(a); i += 1 << 20 {
					copy(a[i:i+1<<20], b[i:i+1<<20])
					copy(b[i:i+1<<20], a[i:i+1<<20])
					point()
				}
			}
		default:
			x := 1.0
			for !quit.Load() {
				for range 1 << 16 {
					x = x*1.0000001 + 1e-9
				}
				point()
			}
			sink.Store(math.Float64bits(x))
		}
	}()
	return func() {
		quit.Store(true)
		<-done
	}
}

// sink keeps contend's loop from being optimized away.
var sink atomic.Uint64

// contentionProbe runs the in-memory slice child alone and beside each
// load of o.contend, in that order, and prints each one's block compute
// (median, min..max, over every block of its timed steps) against
// alone's.
func contentionProbe(o options, exe string, k int, w io.Writer) error {
	loads := append([]string{""}, strings.Split(o.contend, ",")...)
	var alone float64
	for _, l := range loads {
		args := sliceArgs(o, k)
		if l != "" {
			args = append(args, "-contend-with", l)
		}
		var sr sliceResult
		if err := procstat.RunChild(exe, args, &sr); err != nil {
			return fmt.Errorf("-contend %s: %w", l, err)
		}
		med := sr.blockMs()
		what := map[string]string{"": "alone", "cpu": "beside a floating-point loop", "mem": "beside a memory copy",
			"cpu-paced": "beside a floating-point loop with yield points", "mem-paced": "beside a memory copy with yield points"}[l]
		if l == "" {
			alone = med
			fmt.Fprintf(w, "contention probe (-contend %s; the in-memory slice, k=%d): alone a block computes %s ms (CPU %.2f s a step, %.2f cores)\n", o.contend, k, medRange(sr.BlockMs, "%.1f"), stats.Median(sr.StepCPUMs)/1e3, stats.Median(sr.StepCPUMs)/sr.WallMs)
			continue
		}
		fmt.Fprintf(w, "contention probe: %s (one goroutine) a block computes %s ms, %+.0f%% (CPU %.2f s a step, %.2f cores)  load %s\n", what, medRange(sr.BlockMs, "%.1f"), 100*(med/alone-1), stats.Median(sr.StepCPUMs)/1e3, stats.Median(sr.StepCPUMs)/sr.WallMs, loadavg())
	}
	return nil
}

// bigShape is the -big model's heads and FFN width (0: dim/8 and 4 x dim).
func bigShape(o options) (heads, ffn int) {
	heads, ffn = o.heads, o.ffn
	if heads == 0 {
		heads = o.dim / 8
	}
	if ffn == 0 {
		ffn = 4 * o.dim
	}
	return heads, ffn
}

// diskDev is the block device holding a directory, as /proc/diskstats
// names it.
type diskDev struct {
	major, minor uint32
	name         string // "" when /proc/diskstats does not list it
}

// diskOf finds the device holding dir (its st_dev) in /proc/diskstats.
func diskOf(dir string) diskDev {
	var st syscall.Stat_t
	if err := syscall.Stat(filepath.Clean(dir), &st); err != nil {
		return diskDev{}
	}
	dev := uint64(st.Dev)
	d := diskDev{major: uint32((dev>>8)&0xfff | (dev>>32)&^0xfff), minor: uint32(dev&0xff | (dev>>12)&^0xff)}
	d.name, _, _ = diskstatsLine(d.major, d.minor)
	return d
}

func (d diskDev) String() string {
	if d.name == "" {
		return fmt.Sprintf("device %d:%d (not in /proc/diskstats: busy share unknown)", d.major, d.minor)
	}
	return fmt.Sprintf("%s (%d:%d)", d.name, d.major, d.minor)
}

// ioTicks is the device's io_ticks: the milliseconds it had I/O in
// flight since boot.
func (d diskDev) ioTicks() (int64, bool) {
	if d.name == "" {
		return 0, false
	}
	_, t, ok := diskstatsLine(d.major, d.minor)
	return t, ok
}

// diskstatsLine reads /proc/diskstats for the device major:minor: its
// name and io_ticks (the 13th field).
func diskstatsLine(major, minor uint32) (name string, ioTicks int64, ok bool) {
	f, err := os.Open("/proc/diskstats")
	if err != nil {
		return "", 0, false
	}
	defer f.Close()
	return parseDiskstats(f, major, minor)
}

func parseDiskstats(r io.Reader, major, minor uint32) (name string, ioTicks int64, ok bool) {
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 13 || f[0] != strconv.FormatUint(uint64(major), 10) || f[1] != strconv.FormatUint(uint64(minor), 10) {
			continue
		}
		t, err := strconv.ParseInt(f[12], 10, 64)
		if err != nil {
			return f[2], 0, false
		}
		return f[2], t, true
	}
	return "", 0, false
}

// medRange is the median of v with its min..max, each in format f.
func medRange(v []float64, f string) string {
	if len(v) == 0 {
		return "none"
	}
	return fmt.Sprintf(f+" ("+f+".."+f+")", stats.Median(v), slices.Min(v), slices.Max(v))
}

func scale(v []float64, s float64) []float64 {
	out := make([]float64, len(v))
	for i, x := range v {
		out[i] = x * s
	}
	return out
}

func cmpAbs(a, b float64) int {
	switch {
	case math.Abs(a) < math.Abs(b):
		return -1
	case math.Abs(a) > math.Abs(b):
		return 1
	}
	return 0
}

func pct(x float64) string {
	if math.IsNaN(x) {
		return "unknown"
	}
	return fmt.Sprintf("%.0f%%", 100*x)
}

// buildLine says whether the backend's SIMD kernels are in this build.
func buildLine() string {
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, s := range bi.Settings {
			if s.Key == "GOEXPERIMENT" && strings.Contains(s.Value, "simd") {
				return "GOEXPERIMENT=simd"
			}
		}
	}
	return "portable build"
}

func bwLine(r, w float64) string {
	return fmt.Sprintf("read %.2f GB/s, write %.2f GB/s", r/1e9, w/1e9)
}

func freeBytes(dir string) int64 {
	var st syscall.Statfs_t
	if err := syscall.Statfs(filepath.Clean(dir), &st); err != nil {
		return 0
	}
	return int64(st.Bavail) * int64(st.Bsize)
}

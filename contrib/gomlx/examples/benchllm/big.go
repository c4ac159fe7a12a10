package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"syscall"
	"time"

	"github.com/gomlx/compute"
	"github.com/gomlx/compute/dtypes"
	"github.com/gomlx/compute/shapes"
	"github.com/gomlx/gomlx/ml/layers"
	"github.com/gomlx/gomlx/ml/model"
	"github.com/gomlx/gomlx/ml/zoo/transformer"

	"github.com/zinfio/zinf"
	"github.com/zinfio/zinf/config"
	zgomlx "github.com/zinfio/zinf/contrib/gomlx"
	"github.com/zinfio/zinf/metrics/procstat"
)

// big trains one zoo transformer whose training state may exceed the
// machine's RAM (make bench-llm-big): created layer by layer straight
// into zinf (zgomlx.Create: one layer's values in memory at a time),
// every weight, master, Adam moment and gradient on NVMe, o.steps steps
// with a progress line each; then step time against max(the executors'
// measured compute, the planner's disk-bound prediction), peak RSS
// against pinned pool + activations + 512 MiB, and the disk's bytes.
func big(o options, w io.Writer) error {
	ctx := context.Background()
	start := time.Now()
	b, err := compute.NewWithConfig(zgomlx.DefaultBackend)
	if err != nil {
		return err
	}
	heads := o.heads
	if heads == 0 {
		heads = o.dim / 8
	}
	ffn := o.ffn
	if ffn == 0 {
		ffn = 4 * o.dim
	}
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
	// The simulated device's tier holds no tensor here (the executors run
	// on the CPU, from the adapter's Go buffers); it only has to admit
	// the planner's working set (two layers of parameters and one of
	// gradients; the largest layer may be the vocab x dim table, which
	// with few blocks outweighs the rest): room for all of them.
	table := 4 * int64(o.vocab) * int64(o.dim)
	cfg.Zinf.Tiers.GPUBytes = config.Size(4*estParams + 3*table + 1<<30)
	cfg.Zinf.Tiers.CPUPinnedBytes = config.Size(o.pinned)
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
		tr, err := zgomlx.Create(ctx, b, &c, tmp, nt, xs, zgomlx.Options{})
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
	tr, err := zgomlx.Create(ctx, b, cfg, store, net, xs, zgomlx.Options{HeapCredit: credit, OneLayerResident: o.oneLayer})
	if err != nil {
		return err
	}
	defer tr.Close()
	off := tr.Offload()
	rt := off.Runtime()
	var params int64
	for _, v := range off.Vars() {
		params += int64(v.Shape.Size())
	}
	r1, w1, _ := procstat.IO()
	createPeak := procstat.PeakRSS()
	fmt.Fprintf(w, "created layer by layer into zinf in %s: %d parameters (%.3f B) in %d tensors; training state %.2f GiB on NVMe (params, fp32 masters, Adam moments, gradients), %.2fx this machine's RAM; disk written %.2f GiB, read %.2f GiB; peak RSS while creating %.0f MiB\n",
		time.Since(t0).Round(time.Second), params, float64(params)/1e9, len(off.Vars()), float64(off.StateBytes())/(1<<30), float64(off.StateBytes())/float64(procstat.MemTotal()),
		float64(w1-w0)/(1<<30), float64(r1-r0)/(1<<30), float64(createPeak)/(1<<20))

	hc, hcs := off.HeapCredit()
	fmt.Fprintf(w, "heap credit (-heap-credit %s): %.0f MiB, %s\n", o.credit, float64(hc)/(1<<20), hcs)
	if o.oneLayer {
		fmt.Fprintf(w, "swap-ins (-one-layer): one layer's weights and gradients in Go memory at a time (zgomlx.Options.OneLayerResident)\n")
	} else {
		fmt.Fprintf(w, "swap-ins: the next layer's while a layer computes, its gradients handed over during the next backward (two layers' of each in Go memory)\n")
	}
	pl := rt.Plan()
	pr := pl.Predicted
	fmt.Fprintf(w, "plan (rt.Plan): predicted step %.1f s = compute %.1f s (none given: a disk-bound prediction) + exposed parameter I/O %.1f s + exposed gradient I/O %.1f s + exposed optimizer %.1f s (optimizer I/O %.1f s, overlapped %v); NVMe per step read %.2f GiB, written %.2f GiB; prefetch %d layers; pinned pool %.0f MiB; bandwidth %s\n",
		pr.Total.Seconds(), pr.Compute.Seconds(), pr.ExposedParamIO.Seconds(), pr.ExposedGradIO.Seconds(), pr.ExposedOptimizer.Seconds(), pr.OptimizerIO.Seconds(), pr.Overlapped,
		float64(pr.NVMeReadBytes)/(1<<30), float64(pr.NVMeWriteBytes)/(1<<30), pl.PrefetchDepth, float64(o.pinned)/(1<<20), bwLine(rt.Bandwidth().ReadBps(), rt.Bandwidth().WriteBps()))

	// Activations the loop keeps: every layer's output [batch, seq, d]
	// (fp32) until its backward, and the logits [batch, seq, vocab] with
	// their gradient.
	tokens := int64(o.batch * o.seq)
	acts := (int64(o.layers)+2)*tokens*int64(o.dim)*4 + 2*tokens*int64(o.vocab)*4
	bound := o.pinned + acts + 512<<20

	if o.trainLimit != "" {
		lim, err := config.ParseSize(o.trainLimit)
		if err != nil || lim <= 0 {
			return fmt.Errorf("-train-memlimit %q: want a size such as 1600MiB (%v)", o.trainLimit, err)
		}
		prev := debug.SetMemoryLimit(lim)
		fmt.Fprintf(w, "Go memory limit while training (-train-memlimit): %.0f MiB (creating: %.0f MiB)\n", float64(lim)/(1<<20), float64(prev)/(1<<20))
	}
	debug.FreeOSMemory()
	_ = os.WriteFile("/proc/self/clear_refs", []byte("5"), 0) // the peak covers training
	var ms0 runtime.MemStats
	runtime.ReadMemStats(&ms0)
	gc0 := ms0.NumGC
	var walls, computes []time.Duration
	var trainPeak int64
	var tm0 = tr.Timings()
	for s := range o.steps {
		x, y := batch(o, s)
		rss0 := procstat.RSS()
		_ = os.WriteFile("/proc/self/clear_refs", []byte("5"), 0) // this step's peak
		m0 := rt.Metrics()
		r0, w0, _ := procstat.IO()
		c0 := tr.Timings().Compute
		t0 := time.Now()
		loss, err := tr.Step(ctx, x, y)
		if err != nil {
			return fmt.Errorf("step %d: %w", s+1, err)
		}
		wall := time.Since(t0)
		comp := tr.Timings().Compute - c0
		m1 := rt.Metrics()
		r1, w1, _ := procstat.IO()
		stepPeak := procstat.PeakRSS()
		trainPeak = max(trainPeak, stepPeak)
		walls, computes = append(walls, wall), append(computes, comp)
		den := max(comp, pr.Total)
		fmt.Fprintf(w, "step %d/%d  loss %.4f  %.1f s  (compute %.1f s, prediction %.1f s: step/max %.2f)  %.2f tokens/s  NVMe read %.2f GiB written %.2f GiB (the stores' requests %.2f / %.2f GiB; the process's disk I/O %.2f / %.2f GiB)  RSS %.0f MiB before, %.0f after, peak %.0f  load %s\n",
			s+1, o.steps, loss, wall.Seconds(), comp.Seconds(), pr.Total.Seconds(), wall.Seconds()/den.Seconds(), float64(tokens)/wall.Seconds(),
			float64(m1.BytesRead-m0.BytesRead)/(1<<30), float64(m1.BytesWritten-m0.BytesWritten)/(1<<30),
			float64(m1.DeviceBytesRead-m0.DeviceBytesRead)/(1<<30), float64(m1.DeviceBytesWritten-m0.DeviceBytesWritten)/(1<<30), float64(r1-r0)/(1<<30), float64(w1-w0)/(1<<30),
			float64(rss0)/(1<<20), float64(procstat.RSS())/(1<<20), float64(stepPeak)/(1<<20), loadavg())
	}
	tm := tr.Timings()
	peak := trainPeak
	met := rt.Metrics()
	fmt.Fprintf(w, "\nsummary (%d steps):\n", o.steps)
	for i := range walls {
		den := max(computes[i], pr.Total)
		which := "compute"
		if pr.Total > computes[i] {
			which = "the disk-bound prediction"
		}
		fmt.Fprintf(w, "  step %d: %.1f s against max(compute %.1f s, prediction %.1f s) = %s: %.2fx; %.2f GFLOP/s of compute (8 FLOP per parameter per token: forward, recomputed forward, backward)\n",
			i+1, walls[i].Seconds(), computes[i].Seconds(), pr.Total.Seconds(), which, walls[i].Seconds()/den.Seconds(), 8*float64(params)*float64(tokens)/computes[i].Seconds()/1e9)
	}
	per := func(d time.Duration) float64 { return d.Seconds() / float64(o.steps) }
	fmt.Fprintf(w, "  zinf calls of the loop per step: swap-in %.1f s, gradients %.1f s, update start %.1f s, commit %.1f s (the first three overlap compute); runtime's measured compute per layer and pass %.0f ms\n",
		per(tm.SwapIn-tm0.SwapIn), per(tm.Grads-tm0.Grads), per(tm.StepLayer-tm0.StepLayer), per(tm.Commit-tm0.Commit), float64(rt.MeasuredComputePerLayer())/1e6)
	verdict := "within"
	if peak > bound {
		verdict = "ABOVE"
	}
	swap := tr.SwapBufferBytes()
	fmt.Fprintf(w, "  peak RSS while training (VmHWM) %.0f MiB: %s pinned pool %.0f MiB + activations %.1f MiB + 512 MiB = %.0f MiB; the adapter's Go swap-in buffers (largest tensors' shapes, the %d x %d table among them) are %.0f MiB more: pool + swap-in buffers + activations + 512 MiB = %.0f MiB (%s); pinned peak %.0f MiB of %.0f MiB\n",
		float64(peak)/(1<<20), verdict, float64(o.pinned)/(1<<20), float64(acts)/(1<<20), float64(bound)/(1<<20), o.vocab, o.dim, float64(swap)/(1<<20),
		float64(bound+swap)/(1<<20), map[bool]string{true: "within", false: "ABOVE"}[peak <= bound+swap], float64(met.PinnedPeakBytes)/(1<<20), float64(met.PinnedBytes)/(1<<20))
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	fmt.Fprintf(w, "  Go heap at the end: in use %.0f MiB, idle not returned %.0f MiB, GC cycles %d while training (%d in all)\n",
		float64(ms.HeapInuse)/(1<<20), float64(ms.HeapIdle-ms.HeapReleased)/(1<<20), ms.NumGC-gc0, ms.NumGC)
	fmt.Fprintf(w, "  NVMe in all (logical): read %.2f GiB, written %.2f GiB; load average %s; %s in all\n",
		float64(met.BytesRead)/(1<<30), float64(met.BytesWritten)/(1<<30), loadavg(), time.Since(start).Round(time.Second))
	return nil
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

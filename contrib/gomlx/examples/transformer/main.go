// Command transformer trains a small GoMLX transformer language model on
// a synthetic next-token task with zinf as its memory: the parameters and
// Adam states live on NVMe (swap files in --dir), streamed through a
// pinned pool several times smaller than the training state, one layer
// (transformer block) at a time.
//
//	go run ./examples/transformer --verify      # also train in memory and compare
//	go run ./examples/transformer --bench 5     # offloaded vs in-memory step time, allocations, GC, RSS
//
// --verify trains the same model (same seed, same batches) fully in
// memory with the same per-layer executors and zinf's Adam, and as one
// whole GoMLX graph with reference.Adam: both must equal the offloaded run
// bit for bit. It also reports how far GoMLX's own Adam lands.
//
// --bench runs rounds of separate processes, alternating offloaded and
// in-memory training with the same executors, and reports the medians of
// step time, Go heap allocations and GC cycles per step, and peak RSS.
//
// Build with CGO_ENABLED=0: the pure-Go GoMLX backend is the only one
// used.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math"
	"os"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/gomlx/compute"
	"github.com/gomlx/compute/dtypes"
	_ "github.com/gomlx/compute/gobackend" // the pure-Go backend
	"github.com/gomlx/compute/shapes"
	"github.com/gomlx/gomlx/core/graph"
	"github.com/gomlx/gomlx/ml/model"
	gopt "github.com/gomlx/gomlx/ml/train/optimizer"

	"github.com/zinfio/zinf"
	"github.com/zinfio/zinf/config"
	zgomlx "github.com/zinfio/zinf/contrib/gomlx"
	"github.com/zinfio/zinf/contrib/gomlx/reference"
	"github.com/zinfio/zinf/metrics/procstat"
	"github.com/zinfio/zinf/metrics/stats"
	"github.com/zinfio/zinf/plan"
)

type options struct {
	s          shape
	steps      int
	lr         float64
	pinned     int64
	pinnedMode string // "auto", "min" or "" (a size)
	dir        string
	seed       int64
	verify     bool
	bench      int
	benchSteps int
	child      string
	bf16       bool
	backend    string
	heapCredit int64 // zgomlx.Options.HeapCredit
}

func main() {
	var o options
	flag.IntVar(&o.s.blocks, "blocks", 10, "transformer blocks (one zinf layer each)")
	flag.IntVar(&o.s.dim, "dim", 128, "model width")
	flag.IntVar(&o.s.heads, "heads", 4, "attention heads")
	flag.IntVar(&o.s.seq, "seq", 32, "sequence length")
	flag.IntVar(&o.s.batch, "batch", 8, "sequences per batch")
	flag.IntVar(&o.s.vocab, "vocab", 256, "vocabulary size")
	flag.IntVar(&o.steps, "steps", 8, "training steps")
	flag.Float64Var(&o.lr, "lr", 3e-3, "Adam learning rate")
	pinned := flag.String("pinned", "auto", `pinned pool (zinf.tiers.cpu_pinned_bytes): a size ("8MiB"), "min" (the least the model needs: no prefetch window) or "auto" (the minimum plus a prefetch window of two layers)`)
	flag.StringVar(&o.dir, "dir", "", "directory for the swap files (default: a new temp dir under $TMPDIR or /var/tmp, removed at exit)")
	flag.Int64Var(&o.seed, "seed", 1, "initialization seed")
	flag.BoolVar(&o.verify, "verify", false, "also train in memory (per layer and as one graph) and compare bit for bit")
	flag.IntVar(&o.bench, "bench", 0, "rounds of the offloaded vs in-memory benchmark (separate processes, alternating)")
	flag.IntVar(&o.benchSteps, "bench-steps", 6, "timed steps per benchmark process (after 2 warm-up steps)")
	flag.StringVar(&o.child, "child", "", "internal: run one benchmark process (offloaded or memory) and print JSON")
	flag.BoolVar(&o.bf16, "bf16", false, "bfloat16 parameters (fp32 masters in zinf)")
	credit := flag.String("heap-credit", "auto", `zgomlx.Options.HeapCredit for the offloaded model: "none", "auto" (the default: what training in memory keeps live on the heap: the GC paces as in memory, and the heap grows as in memory) or a size`)
	flag.StringVar(&o.backend, "backend", zgomlx.DefaultBackend, "GoMLX backend configuration (the pure-Go backend, \"go\" with its options)")
	flag.Parse()
	o.s.dtype = dtypes.Float32
	if o.bf16 {
		o.s.dtype = dtypes.BFloat16
		// compute v0.1.2's Go backend builds fused dense ops for bf16 and
		// has no kernel to run them; the decomposed ops work.
		os.Setenv(graph.FusionEnv, "false")
	}
	switch *credit {
	case "auto":
		o.heapCredit = zgomlx.AutoHeapCredit
	case "none":
		o.heapCredit = zgomlx.NoHeapCredit
	default:
		sz, err := config.ParseSize(*credit)
		if err != nil || sz < 0 {
			fail(fmt.Errorf("--heap-credit %q: want auto, none or a size such as 64MiB", *credit))
		}
		o.heapCredit = sz
	}
	if *pinned == "min" || *pinned == "auto" {
		o.pinnedMode = *pinned
	} else {
		sz, err := config.ParseSize(*pinned)
		if err != nil || sz <= 0 {
			fail(fmt.Errorf("--pinned %q: want a size such as 8MiB, or min", *pinned))
		}
		o.pinned = sz
	}
	if err := validate(o); err != nil {
		fail(err)
	}
	slog.SetDefault(slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})))
	if o.dir == "" {
		d, err := os.MkdirTemp(tmpRoot(), "zinf-gomlx-")
		if err != nil {
			fail(err)
		}
		defer os.RemoveAll(d)
		o.dir = d
	}
	var err error
	switch {
	case o.child != "":
		err = child(o, os.Stdout)
	case o.bench > 0:
		err = bench(o, os.Stdout)
	default:
		err = train(o, os.Stdout)
	}
	if err != nil {
		os.RemoveAll(o.dir)
		fail(err)
	}
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "transformer:", err)
	os.Exit(1)
}

func validate(o options) error {
	var errs []error
	pos := func(name string, v int) {
		if v < 1 {
			errs = append(errs, fmt.Errorf("--%s %d: must be at least 1", name, v))
		}
	}
	pos("blocks", o.s.blocks)
	pos("dim", o.s.dim)
	pos("heads", o.s.heads)
	pos("seq", o.s.seq)
	pos("batch", o.s.batch)
	pos("steps", o.steps)
	pos("bench-steps", o.benchSteps)
	if o.s.vocab < 2 {
		errs = append(errs, fmt.Errorf("--vocab %d: must be at least 2", o.s.vocab))
	}
	if o.s.heads > 0 && o.s.dim%o.s.heads != 0 {
		errs = append(errs, fmt.Errorf("--dim %d is not a multiple of --heads %d", o.s.dim, o.s.heads))
	}
	if !(o.lr > 0) || math.IsInf(o.lr, 0) {
		errs = append(errs, fmt.Errorf("--lr %v: must be a finite number > 0", o.lr))
	}
	if o.bench < 0 {
		errs = append(errs, fmt.Errorf("--bench %d: must be >= 0", o.bench))
	}
	if o.child != "" && o.child != "offloaded" && o.child != "memory" {
		errs = append(errs, fmt.Errorf("--child %q (allowed: offloaded, memory)", o.child))
	}
	return errors.Join(errs...)
}

func tmpRoot() string {
	if d := os.Getenv("TMPDIR"); d != "" {
		return d
	}
	return "/var/tmp"
}

// setup is the backend, the model and the config.
func setup(o options) (compute.Backend, zgomlx.Net, *config.Config, error) {
	if o.backend != "go" && !strings.HasPrefix(o.backend, "go:") {
		return nil, zgomlx.Net{}, nil, fmt.Errorf("--backend %q: only the pure-Go backend (\"go\" or \"go:options\") is supported", o.backend)
	}
	backend, err := compute.NewWithConfig(o.backend)
	if err != nil {
		return nil, zgomlx.Net{}, nil, fmt.Errorf("--backend %q: %w", o.backend, err)
	}
	n := net(o.s)
	cfg := config.Default()
	cfg.SetScratchDir(o.dir)
	cfg.ZeroOptimization.OffloadParam.MaxInCPU = 0 // every parameter on NVMe, no pinned cache
	cfg.Optimizer.LR = o.lr
	cfg.BF16 = o.bf16
	cfg.Zinf.Tiers.CPUPinnedBytes = config.Size(o.pinned)
	if o.pinned == 0 {
		res, err := minimumPool(backend, n, o, cfg)
		if err != nil {
			return nil, zgomlx.Net{}, nil, err
		}
		pool := res.MinPoolBytes
		if o.pinnedMode == "auto" {
			pool += 2 * res.ParamDemandBytes // room to fetch the next layers while one computes
		}
		cfg.Zinf.Tiers.CPUPinnedBytes = config.Size(pool)
	}
	return backend, n, cfg, nil
}

// create makes the model's variables and trains them offloaded: zinf
// gets each layer's initial values one layer at a time (zgomlx.Create),
// so the whole model is never in memory.
func create(ctx context.Context, backend compute.Backend, n zgomlx.Net, cfg *config.Config, o options) (*zgomlx.Trainer, error) {
	store := model.NewStore()
	store.SetParam(model.ParamInitialSeed, o.seed)
	return zgomlx.Create(ctx, backend, cfg, store, n, zgomlx.Options{HeapCredit: o.heapCredit}, shapes.Make(dtypes.Int32, o.s.batch, o.s.seq))
}

// referenceStore is a Store holding the same initial values as create's,
// for the in-memory references: created the same way (same seed, so the
// same values) in a scratch runtime, then given back to the Store.
func referenceStore(backend compute.Backend, n zgomlx.Net, cfg *config.Config, o options) (*model.Store, error) {
	ctx := context.Background()
	c := *cfg
	dir, err := os.MkdirTemp(o.dir, "reference-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	c.ZeroOptimization.OffloadParam.NVMePath, c.ZeroOptimization.OffloadOptimizer.NVMePath = dir, dir
	tr, err := create(ctx, backend, n, &c, o)
	if err != nil {
		return nil, err
	}
	defer tr.Close()
	if err := tr.Offload().Restore(ctx); err != nil {
		return nil, err
	}
	return tr.Offload().Store(), nil
}

// minimumPool asks zinf how it would split the least pinned pool the
// model needs (Open refuses a smaller one, naming the minimum).
func minimumPool(backend compute.Backend, n zgomlx.Net, o options, cfg *config.Config) (zinf.Reservations, error) {
	c := *cfg
	c.Zinf.Tiers.CPUPinnedBytes = 1
	tr, err := create(context.Background(), backend, n, &c, o)
	if err == nil {
		tr.Close()
		return zinf.Reservations{MinPoolBytes: 1}, nil
	}
	var small *zinf.PoolTooSmallError
	if !errors.As(err, &small) {
		return zinf.Reservations{}, err
	}
	return small.Res, nil
}

// record is one training step.
type record struct {
	loss               float32
	dur, ioWait        time.Duration
	read, written      int64
	mallocs, heapBytes uint64
	gcs                uint32
	gcCPU              float64 // seconds of CPU the GC used (runtime/metrics)
	cpu                float64 // seconds of CPU the process used (getrusage), all threads
}

// cpuSeconds is the user + system CPU time the process has used: unlike
// wall time, other processes on a shared machine barely move it.
func cpuSeconds() float64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return float64(ru.Utime.Sec+ru.Stime.Sec) + float64(ru.Utime.Usec+ru.Stime.Usec)/1e6
}

// gcCPUSeconds is the CPU time the garbage collector has used so far.
func gcCPUSeconds() float64 {
	s := []metrics.Sample{{Name: "/cpu/classes/gc/total:cpu-seconds"}}
	metrics.Read(s)
	if s[0].Value.Kind() != metrics.KindFloat64 {
		return 0
	}
	return s[0].Value.Float64()
}

// runSteps trains steps steps from batch index first, recording each.
func runSteps(ctx context.Context, _ options, step func(context.Context, int) (float32, error), m func() zinf.Metrics, first, steps int, out func(int, record)) ([]record, error) {
	var recs []record
	var ms0, ms1 runtime.MemStats
	for i := first; i < first+steps; i++ {
		var m0 zinf.Metrics
		if m != nil {
			m0 = m()
		}
		runtime.ReadMemStats(&ms0)
		gc0, cpu0 := gcCPUSeconds(), cpuSeconds()
		t0 := time.Now()
		loss, err := step(ctx, i)
		dur := time.Since(t0)
		gc1, cpu1 := gcCPUSeconds(), cpuSeconds()
		runtime.ReadMemStats(&ms1)
		if err != nil {
			return recs, fmt.Errorf("step %d: %w", i+1, err)
		}
		r := record{loss: loss, dur: dur, mallocs: ms1.Mallocs - ms0.Mallocs, heapBytes: ms1.TotalAlloc - ms0.TotalAlloc, gcs: ms1.NumGC - ms0.NumGC, gcCPU: gc1 - gc0, cpu: cpu1 - cpu0}
		if m != nil {
			m1 := m()
			r.ioWait, r.read, r.written = m1.IOWait-m0.IOWait, m1.BytesRead-m0.BytesRead, m1.BytesWritten-m0.BytesWritten
		}
		recs = append(recs, r)
		if out != nil {
			out(i, r)
		}
	}
	return recs, nil
}

// train is the demo: offloaded training with a line per step, the
// summary, and --verify's comparisons.
func train(o options, w io.Writer) error {
	ctx := context.Background()
	backend, n, cfg, err := setup(o)
	if err != nil {
		return err
	}
	fmt.Fprintf(w, "model: transformer LM, %d blocks x width %d, %d heads, seq %d, vocab %d, batch %d, %s params\n",
		o.s.blocks, o.s.dim, o.s.heads, o.s.seq, o.s.vocab, o.s.batch, o.s.dtype)
	tr, err := create(ctx, backend, n, cfg, o)
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
	state, pinnedBytes := off.StateBytes(), int64(cfg.Zinf.Tiers.CPUPinnedBytes)
	fmt.Fprintf(w, "zinf: %d layers, %d tensors, %s params; state %s (params %s + fp32 master, 2 Adam moments, fp32 grads)\n",
		off.Layers(), len(off.Vars()), human(float64(params)), mib(state), rt.DType)
	how := "given"
	switch o.pinnedMode {
	case "min":
		how = "the minimum for this model"
	case "auto":
		how = "the minimum for this model + a 2-layer prefetch window"
	}
	fmt.Fprintf(w, "      pinned pool %s (%s), state / pinned = %.1fx; prefetch %d layer(s) ahead, update overlapped with backward: %v\n",
		mib(pinnedBytes), how, float64(state)/float64(pinnedBytes), rt.Placement().PrefetchDepth, rt.Placement().OverlapStep)
	fmt.Fprintf(w, "      swap files in %s\n", o.dir)
	_, credit := off.HeapCredit()
	fmt.Fprintf(w, "      Go heap credit (--heap-credit, so the GC paces as with the state on the heap): %s\n", credit)
	initPeak := procstat.PeakRSS() // creating the variables and registering them, layer by layer
	debug.FreeOSMemory()           // what initialization freed goes back to the OS first
	procstat.ResetPeakRSS()
	recs, err := runSteps(ctx, o, func(ctx context.Context, i int) (float32, error) {
		x, y := batch(o.s, i)
		return tr.Step(ctx, x, y)
	}, rt.Metrics, 0, o.steps, func(i int, r record) {
		fmt.Fprintf(w, "step %3d/%d  loss %.5f  %8.1f ms  io-wait %6.1f ms  read %s  written %s  mallocs %d  gc %d\n",
			i+1, o.steps, r.loss, ms(r.dur), ms(r.ioWait), mib(r.read), mib(r.written), r.mallocs, r.gcs)
	})
	if err != nil {
		return err
	}
	peak := procstat.PeakRSS()
	met := rt.Metrics()
	fmt.Fprintf(w, "\nsummary: %d steps, loss %.4f -> %.4f, step median %.1f ms, io-wait median %.1f ms\n",
		o.steps, recs[0].loss, recs[len(recs)-1].loss, stats.Median(durs(recs)), stats.Median(waits(recs)))
	fmt.Fprintf(w, "  memory: peak RSS while training %s for %s of state (%.2fx; %s while creating the model), swap-in buffers %s, pinned peak %s of %s\n",
		mib(peak), mib(state), float64(peak)/float64(state), mib(initPeak), mib(tr.SwapBufferBytes()), mib(met.PinnedPeakBytes), mib(met.PinnedBytes))
	tm := tr.Timings()
	per := func(d time.Duration) float64 { return ms(d) / float64(o.steps) }
	fmt.Fprintf(w, "  zinf calls of the loop (the first three overlap the executors), per step: swap-in %.1f ms, gradients %.1f ms, update start %.1f ms, commit %.1f ms\n",
		per(tm.SwapIn), per(tm.Grads), per(tm.StepLayer), per(tm.Commit))
	fmt.Fprintf(w, "  NVMe: read %s, written %s; parameters copied into GoMLX buffers: %d (of %d variables x 2 passes x %d steps)\n",
		mib(met.BytesRead), mib(met.BytesWritten), tr.ParamReads(), len(off.Vars()), o.steps)
	if !o.verify {
		return nil
	}
	return verify(ctx, o, w, backend, n, cfg, off, recs)
}

// snapshot is the offloaded run's final state by variable.
type snapshot struct {
	value             map[string][]byte
	master, m, v      map[string][]float32
	names             []string
	losses            []float32
	dtypeOf           map[string]dtypes.DType
	elements, stateEl int
}

func verify(ctx context.Context, o options, w io.Writer, backend compute.Backend, n zgomlx.Net, cfg *config.Config, off *zgomlx.Offload, recs []record) error {
	snap := snapshot{value: map[string][]byte{}, master: map[string][]float32{}, m: map[string][]float32{}, v: map[string][]float32{}, dtypeOf: map[string]dtypes.DType{}}
	for _, r := range recs {
		snap.losses = append(snap.losses, r.loss)
	}
	for _, v := range off.Vars() {
		t, err := off.ReadVariable(ctx, v.Name)
		if err != nil {
			return err
		}
		snap.value[v.Name] = tensorBytes(t)
		t.FinalizeAll()
		if snap.master[v.Name], snap.m[v.Name], snap.v[v.Name], err = off.Runtime().ReadOptimizerState(ctx, v.Name); err != nil {
			return err
		}
		snap.names = append(snap.names, v.Name)
		snap.dtypeOf[v.Name] = v.Shape.DType
	}
	fmt.Fprintf(w, "\nverify: the same model, seed and batches trained in memory\n")
	// 1. The same per-layer executors, zinf's Adam in Go.
	store, err := referenceStore(backend, n, cfg, o)
	if err != nil {
		return err
	}
	mt, err := reference.NewMemoryTrainer(backend, store, n, cfg, zgomlx.Options{})
	if err != nil {
		return err
	}
	defer mt.Close()
	var losses []float32
	for i := range o.steps {
		x, y := batch(o.s, i)
		l, err := mt.Step(ctx, x, y)
		if err != nil {
			return err
		}
		losses = append(losses, l)
	}
	okLoss := slices.Equal(losses, snap.losses)
	okParams, okStates := true, true
	for _, name := range snap.names {
		okParams = okParams && bytesEqual(tensorBytes(store.GetVariable(name).MustValue()), snap.value[name])
		master, m, v, err := mt.State(name)
		if err != nil {
			return err
		}
		okStates = okStates && bitsEqual(master, snap.master[name]) && bitsEqual(m, snap.m[name]) && bitsEqual(v, snap.v[name])
	}
	fmt.Fprintf(w, "  in memory, same per-layer executors, zinf's Adam:  losses %s, parameters %s, masters and Adam moments %s\n",
		verdict(okLoss), verdict(okParams), verdict(okStates))
	// 2. One whole GoMLX graph with reference.Adam, then with GoMLX's Adam.
	okWhole, err := wholeGraph(o, w, backend, n, cfg, snap, reference.Adam(plan.Hyper(cfg)), "one GoMLX graph, reference.Adam (zinf's Adam):")
	if err != nil {
		return err
	}
	h := plan.Hyper(cfg)
	h.EnsureDefaults()
	if _, err := wholeGraph(o, w, backend, n, cfg, snap, gopt.Adam().LearningRate(float64(h.LR)).Betas(float64(h.Beta1), float64(h.Beta2)).Epsilon(float64(h.Eps)).Done(),
		fmt.Sprintf("one GoMLX graph, GoMLX's Adam (eps %g):       ", h.Eps)); err != nil {
		return err
	}
	if _, err := wholeGraph(o, w, backend, n, cfg, snap, gopt.Adam().LearningRate(float64(h.LR)).Betas(float64(h.Beta1), float64(h.Beta2)).Done(),
		"one GoMLX graph, GoMLX's Adam (its eps 1e-7):  "); err != nil {
		return err
	}
	if !(okLoss && okParams && okStates && okWhole) {
		return errors.New("verify: offloaded training differs from in-memory training")
	}
	fmt.Fprintln(w, "  equality: offloaded training equals in-memory training BIT FOR BIT")
	return nil
}

// wholeGraph trains the model as one graph with opt and compares its
// final parameters with the offloaded run's.
func wholeGraph(o options, w io.Writer, backend compute.Backend, n zgomlx.Net, cfg *config.Config, snap snapshot, opt gopt.Interface, label string) (bool, error) {
	store, err := referenceStore(backend, n, cfg, o)
	if err != nil {
		return false, err
	}
	wg, err := reference.NewWholeGraph(backend, store, n, opt)
	if err != nil {
		return false, err
	}
	defer wg.Close()
	var losses []float32
	for i := range o.steps {
		x, y := batch(o.s, i)
		l, err := wg.Step(x, y)
		if err != nil {
			return false, err
		}
		losses = append(losses, l)
	}
	var equal, total int
	var maxRel, sumRel float64
	for _, name := range snap.names {
		got := asFloat32(snap.dtypeOf[name], tensorBytes(store.GetVariable(name).MustValue()))
		want := asFloat32(snap.dtypeOf[name], snap.value[name])
		for i := range want {
			total++
			if math.Float32bits(got[i]) == math.Float32bits(want[i]) {
				equal++
				continue
			}
			rel := math.Abs(float64(got[i])-float64(want[i])) / max(math.Abs(float64(want[i])), 1e-12)
			maxRel = max(maxRel, rel)
			sumRel += rel
		}
	}
	same := equal == total && slices.Equal(losses, snap.losses)
	fmt.Fprintf(w, "  %s %s of %d weights bit-equal (%.1f%%), max relative difference %.2g, mean %.2g, final loss %.6f vs %.6f\n",
		label, strconv.Itoa(equal), total, 100*float64(equal)/float64(total), maxRel, sumRel/float64(max(total, 1)), losses[len(losses)-1], snap.losses[len(snap.losses)-1])
	return same, nil
}

func verdict(ok bool) string {
	if ok {
		return "BIT FOR BIT"
	}
	return "DIFFER"
}

func bytesEqual(a, b []byte) bool { return string(a) == string(b) }

func bitsEqual(a, b []float32) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if math.Float32bits(a[i]) != math.Float32bits(b[i]) {
			return false
		}
	}
	return true
}

func durs(rs []record) []float64 {
	out := make([]float64, len(rs))
	for i, r := range rs {
		out[i] = ms(r.dur)
	}
	return out
}

func waits(rs []record) []float64 {
	out := make([]float64, len(rs))
	for i, r := range rs {
		out[i] = ms(r.ioWait)
	}
	return out
}

func ms(d time.Duration) float64 { return float64(d) / 1e6 }

func mib(n int64) string { return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20)) }

func human(n float64) string {
	switch {
	case n >= 1e6:
		return fmt.Sprintf("%.2fM", n/1e6)
	case n >= 1e3:
		return fmt.Sprintf("%.1fK", n/1e3)
	}
	return fmt.Sprintf("%.0f", n)
}

// childResult is what a benchmark process reports.
type childResult struct {
	Mode          string    `json:"mode"`
	StepMs        []float64 `json:"step_ms"`
	Mallocs       []uint64  `json:"mallocs"`
	HeapBytes     []uint64  `json:"heap_bytes"`
	GCs           []uint32  `json:"gcs"`
	GCCPUMs       []float64 `json:"gc_cpu_ms"`
	CPUMs         []float64 `json:"cpu_ms"`
	PeakRSS       int64     `json:"peak_rss"`
	StateBytes    int64     `json:"state_bytes"`
	PinnedBytes   int64     `json:"pinned_bytes"`
	IOBytes       int64     `json:"io_bytes_per_step"`
	Layers        int       `json:"layers"`
	NVMeReadBps   float64   `json:"nvme_read_bps"`
	NVMeWriteBps  float64   `json:"nvme_write_bps"`
	ReadPerStep   int64     `json:"read_per_step"`
	WrittenPerStp int64     `json:"written_per_step"`
}

// child trains in one mode after two warm-up steps and prints the timed
// steps as JSON.
func child(o options, w io.Writer) error {
	ctx := context.Background()
	backend, n, cfg, err := setup(o)
	if err != nil {
		return err
	}
	res := childResult{Mode: o.child, PinnedBytes: int64(cfg.Zinf.Tiers.CPUPinnedBytes), Layers: len(n.Layers)}
	var step func(context.Context, int) (float32, error)
	var metrics func() zinf.Metrics
	switch o.child {
	case "memory":
		store, err := referenceStore(backend, n, cfg, o)
		if err != nil {
			return err
		}
		mt, err := reference.NewMemoryTrainer(backend, store, n, cfg, zgomlx.Options{})
		if err != nil {
			return err
		}
		defer mt.Close()
		step = func(ctx context.Context, i int) (float32, error) { x, y := batch(o.s, i); return mt.Step(ctx, x, y) }
	default:
		tr, err := create(ctx, backend, n, cfg, o)
		if err != nil {
			return err
		}
		defer tr.Close()
		rt := tr.Offload().Runtime()
		res.StateBytes = tr.Offload().StateBytes()
		res.NVMeReadBps, res.NVMeWriteBps = rt.Placement().Tiers.NVMeReadBps, rt.Placement().Tiers.NVMeWriteBps
		metrics = rt.Metrics
		step = func(ctx context.Context, i int) (float32, error) { x, y := batch(o.s, i); return tr.Step(ctx, x, y) }
	}
	debug.FreeOSMemory() // what initialization freed goes back to the OS first
	procstat.ResetPeakRSS()
	if _, err := runSteps(ctx, o, step, nil, 0, 2, nil); err != nil {
		return err
	}
	recs, err := runSteps(ctx, o, step, metrics, 2, o.benchSteps, nil)
	if err != nil {
		return err
	}
	res.PeakRSS = procstat.PeakRSS()
	for _, r := range recs {
		res.StepMs = append(res.StepMs, ms(r.dur))
		res.Mallocs = append(res.Mallocs, r.mallocs)
		res.HeapBytes = append(res.HeapBytes, r.heapBytes)
		res.GCs = append(res.GCs, r.gcs)
		res.GCCPUMs = append(res.GCCPUMs, r.gcCPU*1e3)
		res.CPUMs = append(res.CPUMs, r.cpu*1e3)
		res.ReadPerStep += r.read
		res.WrittenPerStp += r.written
	}
	res.ReadPerStep /= int64(len(recs))
	res.WrittenPerStp /= int64(len(recs))
	return json.NewEncoder(w).Encode(res)
}

// bench alternates offloaded and in-memory processes and reports medians.
func bench(o options, w io.Writer) error {
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	var off, mem []childResult
	for round := range o.bench {
		for _, mode := range []string{"offloaded", "memory"} {
			args := []string{"--child", mode, "--dir", o.dir, "--bench-steps", strconv.Itoa(o.benchSteps), "--seed", strconv.FormatInt(o.seed, 10),
				"--blocks", strconv.Itoa(o.s.blocks), "--dim", strconv.Itoa(o.s.dim), "--heads", strconv.Itoa(o.s.heads), "--seq", strconv.Itoa(o.s.seq),
				"--batch", strconv.Itoa(o.s.batch), "--backend", o.backend, "--vocab", strconv.Itoa(o.s.vocab), "--lr", strconv.FormatFloat(o.lr, 'g', -1, 64)}
			if o.pinned > 0 {
				args = append(args, "--pinned", strconv.FormatInt(o.pinned, 10))
			} else {
				args = append(args, "--pinned", o.pinnedMode)
			}
			if o.bf16 {
				args = append(args, "--bf16")
			}
			args = append(args, "--heap-credit", heapCreditFlag(o.heapCredit))
			var r childResult
			if err := procstat.RunChild(exe, args, &r); err != nil {
				return fmt.Errorf("round %d, %s: %w", round+1, mode, err)
			}
			if mode == "memory" {
				mem = append(mem, r)
			} else {
				off = append(off, r)
			}
			fmt.Fprintf(w, "round %d %-9s  step median %8.1f ms  mallocs/step %7.0f  heap/step %s  gc/step %.2f  peak RSS %s\n",
				round+1, mode, stats.Median(r.StepMs), stats.Median(u64(r.Mallocs)), mib(int64(stats.Median(u64(r.HeapBytes)))), stats.Median(u32(r.GCs)), mib(r.PeakRSS))
		}
	}
	pick := func(rs []childResult, f func(childResult) float64) (med, lo, hi float64) {
		v := make([]float64, len(rs))
		for i, r := range rs {
			v[i] = f(r)
		}
		return stats.Median(v), slices.Min(v), slices.Max(v)
	}
	step := func(r childResult) float64 { return stats.Median(r.StepMs) }
	allocs := func(r childResult) float64 { return stats.Median(u64(r.Mallocs)) }
	heap := func(r childResult) float64 { return stats.Median(u64(r.HeapBytes)) }
	gc := func(r childResult) float64 {
		var n float64
		for _, g := range r.GCs {
			n += float64(g)
		}
		return n / float64(len(r.GCs))
	}
	rss := func(r childResult) float64 { return float64(r.PeakRSS) }
	gcCPU := func(r childResult) float64 {
		var n float64
		for _, g := range r.GCCPUMs {
			n += g
		}
		return n / float64(len(r.GCCPUMs))
	}
	ratios := func(f func(childResult) float64) (med, lo, hi float64) {
		v := make([]float64, len(off))
		for i := range off {
			v[i] = f(off[i]) / max(f(mem[i]), 1e-9)
		}
		return stats.Median(v), slices.Min(v), slices.Max(v)
	}
	o0 := off[0]
	L := float64(o0.Layers)
	ioBytes := float64(o0.ReadPerStep + o0.WrittenPerStp)
	memStep, _, _ := pick(mem, step)
	ioLayer := 0.0
	if o0.NVMeReadBps > 0 && o0.NVMeWriteBps > 0 {
		ioLayer = (float64(o0.ReadPerStep)/o0.NVMeReadBps + float64(o0.WrittenPerStp)/o0.NVMeWriteBps) / L * 1e3
	}
	fmt.Fprintf(w, "\nbench: %d rounds x %d timed steps per process (alternating, after 2 warm-up steps each); %d layers; GOGC=%s GOMEMLIMIT=%s; offloaded with --heap-credit %s\n",
		o.bench, o.benchSteps, o0.Layers, envOr("GOGC", "100"), envOr("GOMEMLIMIT", "none"), heapCreditFlag(o.heapCredit))
	fmt.Fprintf(w, "  per layer: compute %.1f ms (in-memory step / layers), NVMe I/O %s (%.1f ms at the planned %s read, %s write)\n",
		memStep/L, mib(int64(ioBytes/L)), ioLayer, gbps(o0.NVMeReadBps), gbps(o0.NVMeWriteBps))
	row := func(what string, f func(childResult) float64, unit func(float64) string) {
		om, ol, oh := pick(off, f)
		mm, ml, mh := pick(mem, f)
		rm, rl, rh := ratios(f)
		fmt.Fprintf(w, "  %-16s offloaded %s (%s..%s)  in memory %s (%s..%s)  ratio %.2fx (%.2f..%.2f)\n", what, unit(om), unit(ol), unit(oh), unit(mm), unit(ml), unit(mh), rm, rl, rh)
	}
	row("step time", step, func(v float64) string { return fmt.Sprintf("%.1f ms", v) })
	row("CPU time/step", func(r childResult) float64 { return stats.Median(r.CPUMs) }, func(v float64) string { return fmt.Sprintf("%.1f ms", v) })
	row("mallocs/step", allocs, func(v float64) string { return fmt.Sprintf("%.0f", v) })
	row("heap bytes/step", heap, func(v float64) string { return mib(int64(v)) })
	row("GC cycles/step", gc, func(v float64) string { return fmt.Sprintf("%.2f", v) })
	row("GC CPU/step", gcCPU, func(v float64) string { return fmt.Sprintf("%.1f ms", v) })
	row("peak RSS", rss, func(v float64) string { return mib(int64(v)) })
	fmt.Fprintf(w, "  training state %s, pinned pool %s: offloaded peak RSS / state = %.2fx\n", mib(o0.StateBytes), mib(o0.PinnedBytes), float64(o0.PeakRSS)/float64(o0.StateBytes))
	return nil
}

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

func gbps(b float64) string { return fmt.Sprintf("%.2f GB/s", b/1e9) }

func u64(v []uint64) []float64 {
	out := make([]float64, len(v))
	for i, x := range v {
		out[i] = float64(x)
	}
	return out
}

func u32(v []uint32) []float64 {
	out := make([]float64, len(v))
	for i, x := range v {
		out[i] = float64(x)
	}
	return out
}

// heapCreditFlag is the --heap-credit value that gives n.
func heapCreditFlag(n int64) string {
	switch n {
	case zgomlx.AutoHeapCredit, 0:
		return "auto"
	case zgomlx.NoHeapCredit:
		return "none"
	}
	return strconv.FormatInt(n, 10)
}

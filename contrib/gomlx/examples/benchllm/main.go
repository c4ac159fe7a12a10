// Command benchllm compares offloaded and in-memory training of GoMLX's
// zoo transformer with a cl100k-sized vocabulary (the model make demo-llm
// trains) on the same per-layer executors: zgomlx.Trainer (every weight,
// master and Adam state on NVMe) against reference.MemoryTrainer (the same
// executors, the state in Go memory). Each measurement is one process
// (so peak RSS is its own); rounds alternate which mode runs first, and
// the summary gives medians over rounds with min..max: CPU time per
// token, wall time per step, GC cycles and mallocs per step, peak RSS
// against the training state, tokens/s, and the offloaded / in-memory
// ratio of each round's pair.
//
//	go run ./examples/benchllm -rounds 3 -steps 6     # make bench-llm
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math"
	"os"
	"runtime"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/gomlx/compute"
	"github.com/gomlx/compute/dtypes"
	_ "github.com/gomlx/compute/gobackend"
	"github.com/gomlx/compute/shapes"
	"github.com/gomlx/gomlx/core/tensors"
	"github.com/gomlx/gomlx/ml/layers"
	"github.com/gomlx/gomlx/ml/model"
	"github.com/gomlx/gomlx/ml/zoo/transformer"

	"github.com/zinfio/zinf/config"
	zgomlx "github.com/zinfio/zinf/contrib/gomlx"
	"github.com/zinfio/zinf/contrib/gomlx/reference"
	"github.com/zinfio/zinf/metrics/procstat"
	"github.com/zinfio/zinf/metrics/stats"
)

type options struct {
	rounds, steps, warm int
	layers, dim, vocab  int
	batch, seq          int
	pinned              int64
	child, dir          string
	rows                bool
	// -big: one offloaded process, created layer by layer (bench-llm-big).
	big, tied  bool
	heads, ffn int
	subgroup   int
	credit     string
	headRows   int
	oneLayer   bool
	trainLimit string
	// memProfile: -big's heap profile after the timed steps.
	memProfile string
	// cpuProfile: the CPU profile of -big's timed steps (or a slice
	// child's).
	cpuProfile string
	// overlap: the offloaded process sets zinf.overlap_update.
	overlap bool
	// checksums: the offloaded process's zinf.checksums.
	checksums bool
	// readAhead: the offloaded process reads the embedding table's
	// optimizer states ahead of its gradient (zgomlx.Options.ReadAheadTables).
	readAhead bool
	// sliceBlocks: -big's in-memory slice; k: a slice child's
	// micro-batches a step.
	sliceBlocks, k int
	// pipelineDepth: the offloaded process's zinf.pipeline_depth (-1:
	// the config's default).
	pipelineDepth int
	// contend: -big's contention probe (after the timed steps, the
	// in-memory slice again beside each of these loads); contendWith: a
	// slice child's load.
	contend, contendWith string
}

func main() {
	var o options
	flag.IntVar(&o.rounds, "rounds", 3, "rounds, each one offloaded and one in-memory process (the order alternates)")
	flag.IntVar(&o.steps, "steps", 6, "timed steps per process")
	flag.IntVar(&o.warm, "warm", 2, "untimed warm-up steps per process")
	flag.IntVar(&o.layers, "layers", 4, "transformer blocks")
	flag.IntVar(&o.dim, "dim", 32, "embedding dimension (heads of 8)")
	flag.IntVar(&o.vocab, "vocab", 100277, "vocabulary (cl100k_base's by default)")
	flag.IntVar(&o.batch, "batch", 2, "sequences per batch")
	flag.IntVar(&o.seq, "seq", 32, "tokens per sequence")
	flag.Int64Var(&o.pinned, "pinned", 32<<20, "zinf.tiers.cpu_pinned_bytes (-big: 0 sizes it from the plan: its minimum plus two layers)")
	flag.StringVar(&o.dir, "dir", "/var/tmp", "directory for the swap files")
	flag.BoolVar(&o.rows, "rows", true, "read the embedding at the batch's rows (TransformerNet's Layer.Lookups); false reads it whole")
	flag.StringVar(&o.child, "child", "", "internal: run one process (offloaded, memory, or -big's in-memory slice) and print JSON")
	flag.IntVar(&o.sliceBlocks, "slice-blocks", 2, "-big: blocks of the in-memory slice (with the embedding and the head) whose step, scaled to every block, is the in-memory compute rate the offloaded steps are compared with")
	flag.IntVar(&o.k, "k", 1, "internal: a slice child's micro-batches a step")
	flag.IntVar(&o.pipelineDepth, "pipeline-depth", -1, "the offloaded process's zinf.pipeline_depth, 0..16: sub-groups the optimizer reads ahead of and writes behind the one it updates (-1: the config's default, auto: deeper for small sub-groups, see optimizer.AutoPipelineDepth)")
	flag.BoolVar(&o.big, "big", false, "train one offloaded model created layer by layer (zgomlx.Create), a model whose state may exceed RAM (make bench-llm-big), by zgomlx.Loop under gradient_accumulation_steps \"auto\" layer-major: warm-up steps at the plan's k, then -steps steps at the planner's k, each followed by an in-memory run of -slice-blocks of its blocks in a child process (the compute-bound rate it is compared with)")
	flag.BoolVar(&o.tied, "tied", false, "-big: tie the output head to the embedding table (TransformerOptions.TieEmbeddings)")
	flag.IntVar(&o.heads, "heads", 0, "-big: attention heads (0: dim/8, heads of 8)")
	flag.IntVar(&o.ffn, "ffn", 0, "-big: FFN width (0: 4 x dim)")
	flag.StringVar(&o.credit, "heap-credit", "auto", "-big: the Go heap credit, auto (zgomlx.AutoHeapCredit, the default: what in-memory training keeps live, at most a quarter of RAM) or none (NoHeapCredit: the collector paces by the live heap)")
	flag.IntVar(&o.headRows, "head-rows", 0, "-big, with -tied: compute the head in blocks of that many table rows (TransformerOptions.HeadBlockRows; layer-major, the table read once a pass in blocks, none of its size in Go memory); 0: one product over the whole table")
	flag.BoolVar(&o.oneLayer, "one-layer", false, "-big: one layer's weights and gradients in Go memory at a time (zgomlx.Options.OneLayerResident): swap-ins and gradient hand-overs no longer overlap compute")
	flag.StringVar(&o.memProfile, "memprofile", "", "-big: write the Go heap's profile (runtime/pprof, after a collection) to this file when the timed steps end: what the live heap the collector scans at every cycle holds")
	flag.StringVar(&o.cpuProfile, "cpuprofile", "", "-big: write the CPU profile (runtime/pprof) of the timed steps to this file (the in-memory slice children run in their own processes, outside it)")
	flag.StringVar(&o.trainLimit, "train-memlimit", "", "-big: the Go memory limit (debug.SetMemoryLimit) from the first step on, e.g. 1600MiB, and for the timed steps that plus the activations the loop keeps at their k; creating keeps GOMEMLIMIT's (a limit below what creating needs makes the collector run without pause)")
	flag.IntVar(&o.subgroup, "subgroup", 1<<16, "zero_optimization.sub_group_size (-big)")
	flag.BoolVar(&o.checksums, "checksums", true, "the offloaded process's zinf.checksums: CRC-32C of every swapped-out tensor, verified on every read (false: the same bytes moved without the CPU work)")
	flag.BoolVar(&o.overlap, "overlap-update", false, "the offloaded process sets zinf.overlap_update: each step's update runs on under the next step's forward")
	flag.StringVar(&o.contend, "contend", "", "-big: after the timed steps, run the in-memory slice again alone and beside one goroutine of other work for each load listed (cpu: a floating-point loop; mem: copies between two 256 MiB buffers; cpu-paced, mem-paced: the same with yield points, as zinf's own background work has; e.g. mem,mem-paced), and print its block compute against alone: what a core's worth of other work (such as the I/O path's checksums, the gradient sums and the optimizer) costs this machine's compute")
	flag.StringVar(&o.contendWith, "contend-with", "", "internal: a slice child's load beside its timed steps (cpu, mem, cpu-paced or mem-paced)")
	flag.BoolVar(&o.readAhead, "read-ahead", false, "the offloaded process reads the embedding table's optimizer states from NVMe during the backward pass of the last layers, ahead of its gradient (zgomlx.Options.ReadAheadTables); combines with -overlap-update")
	flag.Parse()
	slog.SetDefault(slog.New(slog.NewTextHandler(io.Discard, nil)))
	var errs []string
	for _, c := range []struct {
		name string
		v    int
		min  int
	}{{"rounds", o.rounds, 1}, {"steps", o.steps, 1}, {"warm", o.warm, 0}, {"slice-blocks", o.sliceBlocks, 1}, {"k", o.k, 1}, {"layers", o.layers, 1}, {"dim", o.dim, 8}, {"vocab", o.vocab, 2}, {"batch", o.batch, 1}, {"seq", o.seq, 2}} {
		if c.v < c.min {
			errs = append(errs, fmt.Sprintf("-%s %d (allowed: >= %d)", c.name, c.v, c.min))
		}
	}
	if o.dim%8 != 0 {
		errs = append(errs, fmt.Sprintf("-dim %d (allowed: a multiple of 8, the head size)", o.dim))
	}
	if o.heads < 0 || (o.heads > 0 && o.dim%o.heads != 0) {
		errs = append(errs, fmt.Sprintf("-heads %d (allowed: 0, or a divisor of -dim %d)", o.heads, o.dim))
	}
	if o.ffn < 0 {
		errs = append(errs, fmt.Sprintf("-ffn %d (allowed: 0 for 4 x dim, or > 0)", o.ffn))
	}
	if o.subgroup < 1 {
		errs = append(errs, fmt.Sprintf("-subgroup %d (allowed: >= 1)", o.subgroup))
	}
	if o.headRows < 0 || (o.headRows > 0 && !o.tied) {
		errs = append(errs, fmt.Sprintf("-head-rows %d (allowed: 0, or > 0 with -tied)", o.headRows))
	}
	if o.credit != "auto" && o.credit != "none" {
		errs = append(errs, fmt.Sprintf("-heap-credit %q (allowed: auto, none)", o.credit))
	}
	if !o.big && o.child != "slice" && (o.oneLayer || o.trainLimit != "" || o.memProfile != "" || o.cpuProfile != "") {
		errs = append(errs, "-one-layer, -train-memlimit, -memprofile or -cpuprofile without -big (allowed: with -big)")
	}
	if o.trainLimit != "" {
		if lim, err := config.ParseSize(o.trainLimit); err != nil || lim <= 0 {
			errs = append(errs, fmt.Sprintf("-train-memlimit %q (allowed: a size such as 1600MiB)", o.trainLimit))
		}
	}
	if o.big && o.child != "" {
		errs = append(errs, "-big with -child (allowed: one of them)")
	}
	if o.pipelineDepth < -1 || o.pipelineDepth > 16 {
		errs = append(errs, fmt.Sprintf("-pipeline-depth %d (allowed: -1 for the default, or 0..16)", o.pipelineDepth))
	}
	if o.big && o.sliceBlocks > o.layers {
		errs = append(errs, fmt.Sprintf("-slice-blocks %d (allowed: 1..-layers %d)", o.sliceBlocks, o.layers))
	}
	if o.contend != "" {
		for _, l := range strings.Split(o.contend, ",") {
			if !contendLoad(l) {
				errs = append(errs, fmt.Sprintf("-contend %q: load %q (allowed: a list of cpu, mem, cpu-paced, mem-paced)", o.contend, l))
			}
		}
		if !o.big {
			errs = append(errs, fmt.Sprintf("-contend %q without -big (allowed: with -big)", o.contend))
		}
	}
	if o.contendWith != "" && (o.child != "slice" || !contendLoad(o.contendWith)) {
		errs = append(errs, fmt.Sprintf("-contend-with %q (allowed: cpu, mem, cpu-paced or mem-paced, with -child slice)", o.contendWith))
	}
	if o.child != "" && o.child != "offloaded" && o.child != "memory" && o.child != "slice" {
		errs = append(errs, fmt.Sprintf("-child %q (allowed: offloaded, memory, slice)", o.child))
	}
	if len(errs) > 0 {
		fmt.Fprintln(os.Stderr, "benchllm: "+strings.Join(errs, "; "))
		os.Exit(2)
	}
	var err error
	switch {
	case o.big:
		err = big(o, os.Stdout)
	case o.child == "slice":
		err = sliceChild(o, os.Stdout)
	case o.child != "":
		err = child(o, os.Stdout)
	default:
		err = bench(o, os.Stdout)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "benchllm:", err)
		os.Exit(1)
	}
}

// result is what one process reports.
type result struct {
	Mode    string    `json:"mode"`
	WallMs  []float64 `json:"wall_ms"`
	CPUMs   []float64 `json:"cpu_ms"`
	GCs     []float64 `json:"gcs"`
	Mallocs []float64 `json:"mallocs"`
	PeakRSS int64     `json:"peak_rss"`
	// NVMe bytes per timed step (logical: read, written), offloaded only.
	ReadPerStep, WrittenPerStep float64
	StateBytes                  int64 `json:"state_bytes"`
	Params                      int64 `json:"params"`
	// Offloaded only: each layer's executors' compute a timed step
	// (Timings.LayerCompute), its NVMe I/O a step at the bandwidth Open
	// probed (layerIO), and the parameters it holds.
	LayerComputeMs []float64 `json:"layer_compute_ms,omitempty"`
	LayerIOMs      []float64 `json:"layer_io_ms,omitempty"`
	LayerParams    []int64   `json:"layer_params,omitempty"`
	LayerScopes    []string  `json:"layer_scopes,omitempty"`
	// Offloaded only: the loop's waits in zinf a timed step (Timings):
	// swap-ins (with overlap_update: for the update still running too) and
	// the commit (the updates the backward did not cover).
	SwapInMs float64 `json:"swap_in_ms,omitempty"`
	CommitMs float64 `json:"commit_ms,omitempty"`
	// ReadAheadPerStep: offloaded, the optimizer sub-groups updated from
	// records read ahead of their tensor's hand-over, a timed step.
	ReadAheadPerStep float64 `json:"read_ahead_per_step,omitempty"`
}

// layerIO is the time a layer's NVMe traffic of a step takes at read and
// write bandwidths rd and wr (bytes/s): each of its n elements has its
// parameter read (4 bytes; a table read at the batch's rows is counted
// as not read), its gradient written and read back (4 + 4), its
// optimizer record (fp32 master and two Adam moments) read and written
// (12 + 12) and its new parameter written (4).
func layerIO(n int64, rows bool, rd, wr float64) time.Duration {
	read, written := 20*n, 20*n
	if rows {
		read -= 4 * n
	}
	return time.Duration((float64(read)/rd + float64(written)/wr) * 1e9)
}

func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func batch(o options, step int) (x, y *tensors.Tensor) {
	n := o.batch * o.seq
	xs := make([]int32, n)
	ys := make([]int32, n)
	for i := range n {
		t := (i*7919 + step*104729) % o.vocab
		xs[i] = int32(t)
		ys[i] = int32((t*31 + 17) % o.vocab)
	}
	return tensors.FromFlatDataAndDimensions(xs, o.batch, o.seq), tensors.FromFlatDataAndDimensions(ys, o.batch, o.seq)
}

// child trains in one mode and prints its timed steps as JSON.
func child(o options, w io.Writer) error {
	ctx := context.Background()
	b, err := compute.NewWithConfig(zgomlx.DefaultBackend)
	if err != nil {
		return err
	}
	store := model.NewStore()
	store.SetParam(model.ParamInitialSeed, int64(1))
	m := transformer.New(store.RootScope()).WithVocabSize(o.vocab).WithEmbedDim(o.dim).WithNumLayers(o.layers).
		WithNumHeads(o.dim / 8).WithHeadDim(8).WithFFNDim(4 * o.dim).WithRoPE(10000).WithFinalNormalization(layers.NormalizationRMSNorm)
	net, err := zgomlx.TransformerNet(m, zgomlx.TransformerOptions{})
	if err != nil {
		return err
	}
	if !o.rows {
		net.Layers[0].Lookups = nil
	}
	if _, err := zgomlx.Initialize(b, store, net, shapes.Make(dtypes.Int32, o.batch, o.seq)); err != nil {
		return err
	}
	cfg := config.Default()
	dir, err := os.MkdirTemp(o.dir, "zinf-benchllm-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	cfg.SetScratchDir(dir)
	cfg.ZeroOptimization.OffloadParam.MaxInCPU = 0
	cfg.ZeroOptimization.SubGroupSize = 1 << 16
	cfg.Zinf.Tiers.CPUPinnedBytes = config.Size(o.pinned)
	cfg.Optimizer.LR = 0.005
	res := result{Mode: o.child}
	for v := range store.IterVariables() {
		res.Params += int64(v.Shape().Size())
	}
	var step func(x, y *tensors.Tensor) (float32, error)
	io := func() (int64, int64) { return 0, 0 }
	readAhead := func() int { return 0 }
	var layerCompute func() []time.Duration
	var timings func() zgomlx.Timings
	if o.child == "offloaded" {
		o.applyZinf(cfg)
		tr, err := zgomlx.Create(ctx, b, cfg, store, net, zgomlx.Options{ReadAheadTables: o.readAhead})
		if err != nil {
			return err
		}
		defer tr.Close()
		res.StateBytes = tr.Offload().StateBytes()
		rt := tr.Offload().Runtime()
		if o.overlap && !rt.OverlapUpdate() {
			return fmt.Errorf("-overlap-update: the runtime does not overlap the update (plan: overlap step %v)", rt.Placement().OverlapStep)
		}
		io = func() (int64, int64) { m := rt.Metrics(); return m.BytesRead, m.BytesWritten }
		readAhead = func() int { return rt.Metrics().Optimizer.Total.Prefetched }
		step = func(x, y *tensors.Tensor) (float32, error) { return tr.Step(ctx, x, y) }
		layerCompute = func() []time.Duration { return tr.Timings().LayerCompute }
		timings = tr.Timings
		bw := rt.Bandwidth()
		for l := range rt.Layers() {
			var n int64
			for _, name := range rt.LayerTensors(l) {
				lo, hi := rt.Partition(name)
				n += int64(hi - lo)
			}
			rows := o.rows && l == 0 && len(net.Layers[0].Lookups) > 0
			res.LayerParams = append(res.LayerParams, n)
			res.LayerScopes = append(res.LayerScopes, tr.Offload().LayerScope(l))
			res.LayerIOMs = append(res.LayerIOMs, float64(layerIO(n, rows, bw.ReadBps(), bw.WriteBps()))/1e6)
		}
	} else {
		mt, err := reference.NewMemoryTrainer(b, store, net, cfg, zgomlx.Options{})
		if err != nil {
			return err
		}
		defer mt.Close()
		step = func(x, y *tensors.Tensor) (float32, error) { return mt.Step(ctx, x, y) }
	}
	debug.FreeOSMemory()
	_ = os.WriteFile("/proc/self/clear_refs", []byte("5"), 0) // the peak covers training
	for s := range o.warm {
		x, y := batch(o, s)
		if _, err := step(x, y); err != nil {
			return err
		}
	}
	r0, w0 := io()
	ra0 := readAhead()
	var lc0 []time.Duration
	if layerCompute != nil {
		lc0 = layerCompute()
	}
	var tm0 zgomlx.Timings
	if timings != nil {
		tm0 = timings()
	}
	for s := range o.steps {
		x, y := batch(o, o.warm+s)
		var a, c runtime.MemStats
		runtime.ReadMemStats(&a)
		c0, t0 := cpuTime(), time.Now()
		if _, err := step(x, y); err != nil {
			return err
		}
		wall, cpu := time.Since(t0), cpuTime()-c0
		runtime.ReadMemStats(&c)
		res.WallMs = append(res.WallMs, float64(wall)/1e6)
		res.CPUMs = append(res.CPUMs, float64(cpu)/1e6)
		res.GCs = append(res.GCs, float64(c.NumGC-a.NumGC))
		res.Mallocs = append(res.Mallocs, float64(c.Mallocs-a.Mallocs))
	}
	r1, w1 := io()
	if layerCompute != nil {
		for l, d := range layerCompute() {
			if l < len(lc0) {
				d -= lc0[l]
			}
			res.LayerComputeMs = append(res.LayerComputeMs, float64(d)/1e6/float64(o.steps))
		}
	}
	res.ReadPerStep, res.WrittenPerStep = float64(r1-r0)/float64(o.steps), float64(w1-w0)/float64(o.steps)
	res.ReadAheadPerStep = float64(readAhead()-ra0) / float64(o.steps)
	if timings != nil {
		tm := timings()
		res.SwapInMs, res.CommitMs = float64(tm.SwapIn-tm0.SwapIn)/1e6/float64(o.steps), float64(tm.Commit-tm0.Commit)/1e6/float64(o.steps)
	}
	res.PeakRSS = procstat.PeakRSS()
	return jsonOut(w, res)
}

// jsonOut prints a child's result for procstat.RunChild.
func jsonOut(w io.Writer, v any) error { return json.NewEncoder(w).Encode(v) }

// layerCondition prints, per layer, the offloaded runs' compute a step
// against the layer's NVMe I/O a step at the probed bandwidth (medians
// over rounds): the bar's "compute per layer >= I/O per layer" holds for a
// layer when the first is at least the second.
func layerCondition(w io.Writer, off []result) {
	if len(off) == 0 || len(off[0].LayerIOMs) == 0 {
		return
	}
	fmt.Fprintf(w, "  per layer (offloaded, medians over rounds): compute a step against NVMe I/O a step at the bandwidth Open probed\n")
	var fails []string
	for l := range off[0].LayerIOMs {
		var c, d []float64
		for _, r := range off {
			if l < len(r.LayerComputeMs) && l < len(r.LayerIOMs) {
				c = append(c, r.LayerComputeMs[l])
				d = append(d, r.LayerIOMs[l])
			}
		}
		cm, dm := stats.Median(c), stats.Median(d)
		holds := cm >= dm
		if !holds {
			fails = append(fails, off[0].LayerScopes[l])
		}
		fmt.Fprintf(w, "    layer %d %-24s %9d params  compute %8.1f ms  I/O %7.1f ms  %s\n", l, off[0].LayerScopes[l], off[0].LayerParams[l], cm, dm,
			map[bool]string{true: "compute >= I/O", false: "compute < I/O"}[holds])
	}
	if len(fails) == 0 {
		fmt.Fprintf(w, "  compute per layer >= I/O per layer: holds for every layer\n")
	} else {
		fmt.Fprintf(w, "  compute per layer >= I/O per layer: does not hold for %s\n", strings.Join(fails, ", "))
	}
}

func mean(v []float64) float64 {
	var s float64
	for _, x := range v {
		s += x
	}
	return s / float64(max(len(v), 1))
}

func loadavg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "unknown"
	}
	return strings.Join(f[:3], " ")
}

// bench runs the rounds and prints the summary.
func bench(o options, w io.Writer) error {
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	start := time.Now()
	fmt.Fprintf(w, "benchllm: zoo transformer, %d layers, d=%d, vocab %d, batch %d x %d tokens; %d rounds x (%d warm-up + %d timed steps) per process; GOMAXPROCS %d, %d CPUs; load average %s\n",
		o.layers, o.dim, o.vocab, o.batch, o.seq, o.rounds, o.warm, o.steps, runtime.GOMAXPROCS(0), runtime.NumCPU(), loadavg())
	if o.overlap {
		fmt.Fprintf(w, "offloaded with zinf.overlap_update: each step's update runs on under the next step's forward\n")
	}
	if o.pipelineDepth >= 0 {
		fmt.Fprintf(w, "offloaded with zinf.pipeline_depth %d\n", o.pipelineDepth)
	}
	if o.readAhead {
		fmt.Fprintf(w, "offloaded with the embedding table's optimizer states read ahead of its gradient (zgomlx.Options.ReadAheadTables)\n")
	}
	var off, mem []result
	for round := range o.rounds {
		order := []string{"offloaded", "memory"}
		if round%2 == 1 {
			order = []string{"memory", "offloaded"}
		}
		for _, mode := range order {
			args := []string{"-child", mode, "-dir", o.dir, "-steps", strconv.Itoa(o.steps), "-warm", strconv.Itoa(o.warm),
				"-layers", strconv.Itoa(o.layers), "-dim", strconv.Itoa(o.dim), "-vocab", strconv.Itoa(o.vocab),
				"-batch", strconv.Itoa(o.batch), "-seq", strconv.Itoa(o.seq), "-pinned", strconv.FormatInt(o.pinned, 10), "-rows=" + strconv.FormatBool(o.rows),
				"-overlap-update=" + strconv.FormatBool(o.overlap), "-checksums=" + strconv.FormatBool(o.checksums), "-pipeline-depth", strconv.Itoa(o.pipelineDepth),
				"-read-ahead=" + strconv.FormatBool(o.readAhead)}
			var r result
			if err := procstat.RunChild(exe, args, &r); err != nil {
				return fmt.Errorf("round %d, %s: %w", round+1, mode, err)
			}
			if mode == "memory" {
				mem = append(mem, r)
			} else {
				off = append(off, r)
			}
			zw := ""
			if mode == "offloaded" {
				zw = fmt.Sprintf("  swap-in %.1f ms  commit %.1f ms", r.SwapInMs, r.CommitMs)
				if o.readAhead {
					zw += fmt.Sprintf("  read ahead %.1f sub-groups", r.ReadAheadPerStep)
				}
			}
			fmt.Fprintf(w, "round %d %-9s  wall/step %7.1f ms  CPU/step %7.1f ms  GC/step %.2f  mallocs/step %6.0f  peak RSS %6.1f MiB%s  (load %s)\n",
				round+1, mode, stats.Median(r.WallMs), stats.Median(r.CPUMs), mean(r.GCs), stats.Median(r.Mallocs), float64(r.PeakRSS)/(1<<20), zw, loadavg())
		}
	}
	tokens := float64(o.batch * o.seq)
	stat := func(rs []result, f func(result) float64) (med, lo, hi float64) {
		v := make([]float64, len(rs))
		for i, r := range rs {
			v[i] = f(r)
		}
		return stats.Median(v), slices.Min(v), slices.Max(v)
	}
	ratio := func(f func(result) float64) (med, lo, hi float64) {
		// Rounds whose in-memory figure is 0 (no GC cycle) have no
		// ratio; none at all prints NaN.
		var v []float64
		for i := range off {
			if d := f(mem[i]); d > 0 {
				v = append(v, f(off[i])/d)
			}
		}
		if len(v) == 0 {
			return math.NaN(), math.NaN(), math.NaN()
		}
		return stats.Median(v), slices.Min(v), slices.Max(v)
	}
	fmt.Fprintf(w, "\nmedians over %d rounds (min..max); ratio = offloaded / in memory, paired by round:\n", o.rounds)
	row := func(what, unit string, f func(result) float64) {
		om, ol, oh := stat(off, f)
		mm, ml, mh := stat(mem, f)
		rm, rl, rh := ratio(f)
		fmt.Fprintf(w, "  %-15s offloaded %7.1f%s (%.1f..%.1f)  in memory %7.1f%s (%.1f..%.1f)  ratio %.2fx (%.2f..%.2f)\n", what, om, unit, ol, oh, mm, unit, ml, mh, rm, rl, rh)
	}
	row("CPU time/token", " ms", func(r result) float64 { return stats.Median(r.CPUMs) / tokens })
	row("wall time/step", " ms", func(r result) float64 { return stats.Median(r.WallMs) })
	row("tokens/s", "", func(r result) float64 { return tokens / (stats.Median(r.WallMs) / 1e3) })
	row("GC cycles/step", "", func(r result) float64 { return mean(r.GCs) })
	row("mallocs/step", "", func(r result) float64 { return stats.Median(r.Mallocs) })
	row("peak RSS", " MiB", func(r result) float64 { return float64(r.PeakRSS) / (1 << 20) })
	rm, rl, rh := stat(off, func(r result) float64 { return r.ReadPerStep / (1 << 20) })
	wm, wl, wh := stat(off, func(r result) float64 { return r.WrittenPerStep / (1 << 20) })
	fmt.Fprintf(w, "  NVMe per step (offloaded; the embedding read %s): read %.1f MiB (%.1f..%.1f), written %.1f MiB (%.1f..%.1f)\n",
		map[bool]string{true: "at the batch's rows", false: "whole (-rows=false)"}[o.rows], rm, rl, rh, wm, wl, wh)
	o0 := off[0]
	layerCondition(w, off)
	fmt.Fprintf(w, "  %d parameters; training state %.1f MiB (on NVMe offloaded, in Go memory in the in-memory run); pinned pool %.1f MiB; offloaded peak RSS / state %.2fx\n",
		o0.Params, float64(o0.StateBytes)/(1<<20), float64(o.pinned)/(1<<20), float64(o0.PeakRSS)/float64(o0.StateBytes))
	fmt.Fprintf(w, "  load average at the end %s; %s in all\n", loadavg(), time.Since(start).Round(time.Second))
	return nil
}

// applyZinf sets the offloaded run's zinf keys its flags name
// (-overlap-update, -checksums, -pipeline-depth), in the small bench's
// offloaded child and in the -big run alike.
func (o options) applyZinf(cfg *config.Config) {
	cfg.Zinf.OverlapUpdate = o.overlap
	cfg.Zinf.Checksums = o.checksums
	if o.pipelineDepth >= 0 {
		cfg.Zinf.PipelineDepth, cfg.Zinf.PipelineDepthAuto = o.pipelineDepth, false
	}
}

// contendLoad says whether l is one of contend's loads.
func contendLoad(l string) bool {
	switch l {
	case "cpu", "mem", "cpu-paced", "mem-paced":
		return true
	}
	return false
}

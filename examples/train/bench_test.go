package train

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/zinfio/zinf"
	"github.com/zinfio/zinf/aio"
	"github.com/zinfio/zinf/config"
	"github.com/zinfio/zinf/metrics/stats"
	"github.com/zinfio/zinf/plan"
	"github.com/zinfio/zinf/swapper/optimizer"
)

// benchDir is where benchmark swap files go: $ZINF_BENCH_DIR, else a temp
// dir on the default disk.
func benchDir(b *testing.B) string {
	if d := os.Getenv("ZINF_BENCH_DIR"); d != "" {
		return d
	}
	return b.TempDir()
}

func benchInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}

func benchConfig(b *testing.B, dir string) *config.Config {
	c := config.Default()
	c.SetScratchDir(dir)
	c.ZeroOptimization.OffloadParam.MaxInCPU = 0
	c.ZeroOptimization.OffloadParam.BufferSize = 1
	c.Zinf.Tiers.CPUPinnedBytes = 256 << 20
	c.Zinf.Checksums = os.Getenv("ZINF_BENCH_CHECKSUMS") != "0"
	c.Zinf.PipelineDepth = benchInt("ZINF_BENCH_DEPTH", 2)
	c.AIO.QueueDepth = 32
	c.ZeroOptimization.SubGroupSize = int64(benchInt("ZINF_BENCH_SUBGROUP", 1<<20))
	if err := c.Validate(); err != nil {
		b.Fatal(err)
	}
	return c
}

// BenchmarkOverlap compares the step time of offloaded training with the
// compute-only step (the same loop in memory with the same simulated
// compute) when simulated compute per layer exceeds the I/O per layer.
// It reports step/compute-only as the metric "x-compute-only" (median of
// the steps after the first). ZINF_BENCH_COMPUTE_MS sets the compute per
// layer per pass (default 20), ZINF_BENCH_WIDTH the width (default 512).
func BenchmarkOverlap(b *testing.B) {
	spec := Spec{Layers: 8, Width: benchInt("ZINF_BENCH_WIDTH", 512), Batch: 4, Seed: 1}
	compute := time.Duration(benchInt("ZINF_BENCH_COMPUTE_MS", 20)) * time.Millisecond
	steps := 6
	for i := 0; i < b.N; i++ {
		cfg := benchConfig(b, benchDir(b))
		res, err := Run(context.Background(), Options{Config: cfg, Spec: spec, Steps: steps, ComputePerLayer: compute, Logger: quiet})
		if err != nil {
			b.Fatal(err)
		}
		// Compute-only: the same loop, same compute, tensors in memory.
		ref := mustMem(b, spec, cfg)
		var refMs []float64
		if err := runLoop(context.Background(), spec, ref, loopOptions{Steps: steps, Micro: 1, World: 1, ComputePerLayer: compute,
			OnStep: func(_ int, _ float32, d time.Duration) error { refMs = append(refMs, float64(d)/1e6); return nil }}); err != nil {
			b.Fatal(err)
		}
		off := median(res.StepMs[1:])
		co := median(refMs[1:])
		ioPerLayerMs := float64(res.BytesRead+res.BytesWritten) / float64(steps) / float64(spec.Layers) / 1e6 // MB per layer per step
		b.ReportMetric(off, "step-ms")
		b.ReportMetric(co, "compute-only-ms")
		b.ReportMetric(off/co, "x-compute-only")
		b.ReportMetric(ioPerLayerMs, "io-MB/layer")
		b.ReportMetric(res.OptimizerMsMedian, "optimizer-ms")
	}
}

// BenchmarkOptimizerVsIO runs the optimizer step with no simulated compute
// and compares the rate it moves its bytes at with the rate `zinf io`
// read and write bandwidths on the same path predict for those bytes
// (time = read bytes / read bandwidth + written bytes / write bandwidth).
// Metric "x-io-predicted" is achieved/predicted (medians).
func BenchmarkOptimizerVsIO(b *testing.B) {
	width := benchInt("ZINF_BENCH_WIDTH", 1024)
	rounds := benchInt("ZINF_BENCH_ROUNDS", 9)
	spec := Spec{Layers: 8, Width: width, Batch: 1, Seed: 1}
	ctx := context.Background()
	zinfBin := buildZinf(b)
	for i := 0; i < b.N; i++ {
		dir := benchDir(b)
		cfg := benchConfig(b, dir)
		eo := plan.EngineOptions(cfg, quiet, nil)
		rt, err := zinf.Open(cfg, spec.Model(), zinf.Options{Logger: quiet})
		if err != nil {
			b.Fatal(err)
		}
		be, err := newZinfBackend(ctx, spec, []*zinf.Runtime{rt})
		if err != nil {
			b.Fatal(err)
		}
		// zinf io on the same path: read and write bandwidth of a 128 MiB
		// file, 2 loops each (medians).
		ioDisk := newDiskStat(dir)
		measureIO := func() (rbw, wbw float64) {
			for _, op := range []string{"write", "read"} {
				ioDisk.mark()
				ioDisk.wq = ioDisk.field(10)
				r := zinfIO(b, zinfBin, dir, op, eo)
				if os.Getenv("ZINF_BENCH_TIMELINE") == "1" {
					el := float64(time.Since(ioDisk.at)) / 1e6
					b.Logf("  zinf io %s: %.3f GB/s, device busy %.2f, mean requests in flight %.1f", op, r.GBpsMedian,
						float64(ioDisk.read()-ioDisk.ticks)/el, float64(ioDisk.field(10)-ioDisk.wq)/el)
				}
				if op == "read" {
					// The file is this benchmark's; the next
					// measurement writes a fresh one.
					os.Remove(dir + "/bench-io.dat")
					rbw = r.GBpsMedian
				} else {
					wbw = r.GBpsMedian
				}
			}
			return rbw, wbw
		}
		// This virtual disk changes speed from second to second, so each
		// round pairs one training step (its optimizer step run after
		// backward, timed alone) with zinf io just before and just after;
		// the prediction uses the mean of the two. Medians over rounds.
		var readBW, writeBW, optMs, optGBps, predMs, ratio []float64
		disk := newDiskStat(dir)
		// The device's view of each optimizer step: busy time and the
		// mean number of requests in flight (from the stat file's io_ticks
		// and time_in_queue).
		var stepDisk string
		stepHook = func(begin bool) {
			if begin {
				disk.mark()
				disk.wq = disk.field(10)
				return
			}
			el := float64(time.Since(disk.at)) / 1e6
			r, w := disk.moved()
			stepDisk = fmt.Sprintf("device during the step: busy %.2f, mean requests in flight %.1f, %d read, %d written",
				float64(disk.read()-disk.ticks)/el, float64(disk.field(10)-disk.wq)/el, r, w)
		}
		defer func() { stepHook = nil }()
		for round := 0; round < rounds+1; round++ {
			r1, w1 := measureIO()
			disk.mark()
			if err := runLoop(ctx, spec, be, loopOptions{Steps: 1, Micro: 1, World: 1, Start: round}); err != nil {
				b.Fatal(err)
			}
			r2, w2 := measureIO()
			if round == 0 {
				continue // the first step also writes every record for the first time
			}
			st := be.optSteps[len(be.optSteps)-1]
			rbw, wbw := (r1+r2)/2, (w1+w2)/2
			ms := float64(st.d) / 1e6
			pred := (float64(st.read)/rbw + float64(st.written)/wbw) / 1e6
			readBW, writeBW, optMs, predMs = append(readBW, rbw), append(writeBW, wbw), append(optMs, ms), append(predMs, pred)
			optGBps = append(optGBps, float64(st.read+st.written)/ms/1e6)
			ratio = append(ratio, pred/ms)
			b.Logf("round %d: io read %.3f GB/s, write %.3f GB/s; optimizer %.1f ms for %d+%d bytes (%.3f GB/s), predicted %.1f ms: %.3f",
				round, rbw, wbw, ms, st.read, st.written, optGBps[len(optGBps)-1], pred, pred/ms)
			logStep(b, rt.Metrics().Optimizer.Last)
			b.Logf("  %s", stepDisk)
		}
		es := rt.Metrics().Engine
		b.Logf("engine: %d pieces, %d with registered buffers, %d with fixed files; %d bytes registered",
			es.Pieces, es.FixedBufferPieces, es.FixedFilePieces, es.RegisteredBytes)
		rt.Close()
		b.ReportMetric(median(readBW), "io-read-GB/s")
		b.ReportMetric(median(writeBW), "io-write-GB/s")
		b.ReportMetric(median(optGBps), "optimizer-GB/s")
		b.ReportMetric(median(optMs), "optimizer-ms")
		b.ReportMetric(median(predMs), "predicted-ms")
		b.ReportMetric(median(ratio), "x-io-predicted")
	}
}

// BenchmarkClipOverlap measures what gradient clipping costs the
// overlapped step, on BenchmarkOverlap's setup (8 layers x 512, everything
// on NVMe, ZINF_BENCH_COMPUTE_MS of simulated compute per layer and pass,
// default 20): clipping off; clipping on and never triggering (the
// updates still start during backward and commit); clipping triggering
// on every step with speculation always (every step rolled back and
// redone) and never (the update waits for the norm). Rounds of the four
// runs are interleaved, their order rotated each round
// (ZINF_BENCH_ROUNDS, default 5); each run's figure is the median step
// after the first. Metrics are medians over rounds and their ratios.
func BenchmarkClipOverlap(b *testing.B) {
	spec := Spec{Layers: 8, Width: benchInt("ZINF_BENCH_WIDTH", 512), Batch: 4, Seed: 1}
	compute := time.Duration(benchInt("ZINF_BENCH_COMPUTE_MS", 20)) * time.Millisecond
	rounds := benchInt("ZINF_BENCH_ROUNDS", 5)
	const steps = 6
	type variant struct {
		name      string
		clip      float64
		speculate config.SpeculateMode
	}
	variants := []variant{
		{"off", 0, config.SpeculateAuto},
		{"on-not-triggering", 1e9, config.SpeculateAuto},
		{"triggering-speculate", 1e-9, config.SpeculateAlways},
		{"triggering-no-speculation", 1e-9, config.SpeculateNever},
	}
	for i := 0; i < b.N; i++ {
		stepMs := make([][]float64, len(variants))
		rollbackMs := make([][]float64, len(variants))
		for round := range rounds {
			for k := range variants {
				v := variants[(k+round)%len(variants)]
				vi := (k + round) % len(variants)
				cfg := benchConfig(b, benchDir(b))
				cfg.GradientClipping = v.clip
				cfg.Zinf.Speculate = v.speculate
				res, err := Run(context.Background(), Options{Config: cfg, Spec: spec, Steps: steps, ComputePerLayer: compute, Logger: quiet})
				if err != nil {
					b.Fatal(err)
				}
				if !res.OverlapStep {
					b.Fatal("the plan does not overlap the step here; nothing to measure")
				}
				wantClipped := 0
				if v.clip > 0 && v.clip < 1 {
					wantClipped = steps
				}
				if res.ClippedSteps != wantClipped {
					b.Fatalf("%s: %d clipped steps, want %d", v.name, res.ClippedSteps, wantClipped)
				}
				ms := median(res.StepMs[1:])
				stepMs[vi] = append(stepMs[vi], ms)
				rollbackMs[vi] = append(rollbackMs[vi], res.RollbackMs/float64(steps))
				b.Logf("round %d %-26s step %7.1f ms (steps %v), speculated %d, rolled back %d (%.1f ms in all)",
					round, v.name, ms, res.StepMs, res.Speculated, res.Rollbacks, res.RollbackMs)
			}
		}
		med := make([]float64, len(variants))
		for k, v := range variants {
			med[k] = median(stepMs[k])
			lo, hi := stats.MinMax(stepMs[k])
			b.Logf("%-26s median %7.1f ms (min %.1f, max %.1f over %d rounds), rollback %.2f ms per step", v.name, med[k], lo, hi, rounds, median(rollbackMs[k]))
			b.ReportMetric(med[k], v.name+"-ms")
		}
		b.ReportMetric(med[1]/med[0], "x-on-not-triggering/off")
		b.ReportMetric(med[2]/med[3], "x-triggering-speculate/never")
		b.ReportMetric(med[2]/med[0], "x-triggering-speculate/off")
		b.ReportMetric(med[3]/med[0], "x-triggering-never/off")
		b.ReportMetric(median(rollbackMs[2]), "rollback-ms/step")
	}
}

// logStep logs where an optimizer step's time went (see
// optimizer.StepStats), and with ZINF_BENCH_TIMELINE=1 its sub-groups'
// timelines, in milliseconds from the step's start.
func logStep(b *testing.B, st optimizer.StepStats) {
	ms := func(d time.Duration) float64 { return float64(d) / 1e6 }
	b.Logf("  step %.1f ms: drain %.1f, update compute %.1f, read wait %.1f, write wait %.1f, commit %.1f, I/O gaps %.1f ms",
		ms(st.Elapsed), ms(st.Drain), ms(st.Compute), ms(st.ReadWait), ms(st.WriteWait), ms(st.Commit), ms(st.IOGaps))
	if os.Getenv("ZINF_BENCH_TIMELINE") != "1" {
		return
	}
	for _, t := range st.Timeline {
		b.Logf("    %s/%d: ahead %.1f buffered %.1f read %.1f..%.1f grad ..%.1f picked %.1f updated %.1f write %.1f..%.1f retired %.1f",
			t.Tensor, t.SubGroup, ms(t.Ahead), ms(t.Buffered), ms(t.ReadIssued), ms(t.ReadDone), ms(t.GradRead), ms(t.Picked),
			ms(t.Updated), ms(t.WriteIssued), ms(t.WriteDone), ms(t.Retired))
	}
}

// diskStat reads the io_ticks of the block device under a directory
// (/sys/dev/block/M:m/stat), to tell how busy the disk was.
type diskStat struct {
	path   string
	ticks  int64
	at     time.Time
	rs, ws int64
	wq     int64 // time_in_queue at mark
}

func newDiskStat(dir string) *diskStat {
	var st unix.Stat_t
	if err := unix.Stat(dir, &st); err != nil {
		return &diskStat{}
	}
	return &diskStat{path: fmt.Sprintf("/sys/dev/block/%d:%d/stat", unix.Major(st.Dev), unix.Minor(st.Dev))}
}

func (d *diskStat) read() int64 { return d.field(9) }

func (d *diskStat) field(i int) int64 {
	b, err := os.ReadFile(d.path)
	if err != nil {
		return -1
	}
	f := strings.Fields(string(b))
	if len(f) < 10 {
		return -1
	}
	n, err := strconv.ParseInt(f[i], 10, 64)
	if err != nil {
		return -1
	}
	return n
}

// mark starts an interval; busy ends it and returns the fraction of it
// the device had I/O in flight.
func (d *diskStat) mark() {
	d.ticks, d.at = d.read(), time.Now()
	d.rs, d.ws = d.field(2), d.field(6)
}

// moved returns the bytes read and written on the device since mark.
func (d *diskStat) moved() (r, w int64) { return (d.field(2) - d.rs) * 512, (d.field(6) - d.ws) * 512 }

func (d *diskStat) busy() float64 {
	t := d.read()
	if t < 0 || d.ticks < 0 {
		return -1
	}
	return float64(t-d.ticks) / (float64(time.Since(d.at)) / 1e6)
}

// ioResult is what `zinf io --json` prints that the benchmark reads.
type ioResult struct {
	GBpsMedian float64 `json:"gbps_median"`
}

// buildZinf builds cmd/zinf into a directory the benchmark removes.
func buildZinf(b *testing.B) string {
	b.Helper()
	bin := filepath.Join(b.TempDir(), "zinf")
	if out, err := exec.Command("go", "build", "-o", bin, "github.com/zinfio/zinf/cmd/zinf").CombinedOutput(); err != nil {
		b.Fatalf("go build cmd/zinf: %v\n%s", err, out)
	}
	return bin
}

// zinfIO runs `zinf io` (the binary bin) on dir: op ("read" or "write")
// of a 128 MiB file bench-io.dat, kept, 2 timed loops and no warm-up, with
// the engine options eo.
func zinfIO(b *testing.B, bin, dir, op string, eo aio.Options) ioResult {
	b.Helper()
	backend := eo.Backend
	if backend == "" {
		backend = aio.BackendAuto
	}
	direct := map[aio.DirectPolicy]string{aio.DirectOptional: "optional", aio.DirectRequired: "required", aio.DirectOff: "off"}[eo.Direct]
	args := []string{"io", "--json", "--path", dir, "--size", "128MiB", "--op", op, "--loops", "2", "--warmup", "0", "--keep",
		"--file", "bench-io.dat", "--backend", backend, "--block-size", strconv.Itoa(eo.BlockSizeBytes),
		"--queue-depth", strconv.Itoa(eo.QueueDepth), "--parallel", strconv.Itoa(max(eo.IntraOpParallelism, 1)), "--direct", direct}
	if eo.SingleSubmit {
		args = append(args, "--single-submit")
	}
	if eo.SerialEvents {
		args = append(args, "--no-overlap-events")
	}
	cmd := exec.Command(bin, args...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		b.Fatalf("zinf %s: %v\n%s", strings.Join(args, " "), err, stderr.String())
	}
	var r ioResult
	if err := json.Unmarshal(out, &r); err != nil {
		b.Fatalf("zinf %s: %v in %q", strings.Join(args, " "), err, out)
	}
	return r
}

package main

import (
	"compress/gzip"
	"io"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/zinfio/zinf"
	"github.com/zinfio/zinf/config"
)

// TestParseDiskstats: the device is found by major:minor and its
// io_ticks is the 13th field; a device not listed is not found.
func TestParseDiskstats(t *testing.T) {
	const stats = ` 254       0 vda 1000 2 30000 400 500 6 70000 800 0 12345 1500 0 0 0 0
 254       1 vda1 10 0 300 4 5 0 700 8 0 999 12 0 0 0 0
   7       0 loop0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0
`
	name, ticks, ok := parseDiskstats(strings.NewReader(stats), 254, 1)
	if !ok || name != "vda1" || ticks != 999 {
		t.Fatalf("254:1: %q %d %v, want vda1 999 true", name, ticks, ok)
	}
	if name, ticks, ok = parseDiskstats(strings.NewReader(stats), 254, 0); !ok || name != "vda" || ticks != 12345 {
		t.Fatalf("254:0: %q %d %v, want vda 12345 true", name, ticks, ok)
	}
	if _, _, ok = parseDiskstats(strings.NewReader(stats), 8, 0); ok {
		t.Fatal("8:0 found in stats that do not list it")
	}
}

// TestSliceEstimate: the in-memory step of L blocks is, for each of the
// slice's steps, its compute plus its blocks' mean per missing block; the
// median over the steps. A result without the steps (an older child)
// falls back to the median block.
func TestSliceEstimate(t *testing.T) {
	r := sliceResult{Blocks: 2, WallMs: 900, ComputeMs: 800, BlockMs: []float64{100, 120}}
	if got, want := r.estimate(10), time.Duration((800+8*110)*1e6); got != want {
		t.Fatalf("estimate(10) without steps = %v, want %v", got, want)
	}
	// Three steps: 500 + 8 x 150 = 1700, 600 + 8 x 100 = 1400, 900 + 8 x
	// 400 = 4100; the median 1700. The median block (150) would give
	// 600 + 8 x 150 = 1800.
	r = sliceResult{Blocks: 2, ComputeMs: 600, BlockMs: []float64{100, 200, 90, 110, 150, 650},
		StepMs: []float64{500, 600, 900}, StepBlocksMs: []float64{300, 200, 800}}
	if got, want := r.estimate(10), time.Duration(1700*1e6); got != want {
		t.Fatalf("estimate(10) = %v, want %v", got, want)
	}
	if got, want := r.restMs(), 200.0; got != want {
		t.Fatalf("restMs = %v, want %v", got, want)
	}
	if got := medRange([]float64{3, 1, 2}, "%.1f"); got != "2.0 (1.0..3.0)" {
		t.Fatalf("medRange = %q", got)
	}
}

// TestApplyZinf: the offloaded run's flags reach the config (the -big run
// once ignored -overlap-update and -pipeline-depth); -pipeline-depth -1
// keeps the config's own.
func TestApplyZinf(t *testing.T) {
	cfg := config.Default()
	def := cfg.Zinf.PipelineDepth
	options{overlap: true, checksums: false, pipelineDepth: -1}.applyZinf(cfg)
	if !cfg.Zinf.OverlapUpdate || cfg.Zinf.Checksums || cfg.Zinf.PipelineDepth != def {
		t.Fatalf("overlap %v checksums %v depth %d, want true false %d", cfg.Zinf.OverlapUpdate, cfg.Zinf.Checksums, cfg.Zinf.PipelineDepth, def)
	}
	options{checksums: true, pipelineDepth: 3}.applyZinf(cfg)
	if cfg.Zinf.OverlapUpdate || !cfg.Zinf.Checksums || cfg.Zinf.PipelineDepth != 3 {
		t.Fatalf("overlap %v checksums %v depth %d, want false true 3", cfg.Zinf.OverlapUpdate, cfg.Zinf.Checksums, cfg.Zinf.PipelineDepth)
	}
}

// TestContendStops: each load of -contend runs until its stop function
// is called, which returns once the load's goroutine has ended (the paced
// ones with compute marked, so that their yield points pause). The load's
// goroutine is found by its creator in a dump of every goroutine's stack,
// not by counting goroutines: a goroutine of an earlier test that ends
// meanwhile would change the count (CI saw that, once).
func TestContendStops(t *testing.T) {
	end := zinf.BeginCompute()
	defer end()
	loads := func() int {
		buf := make([]byte, 1<<20)
		for {
			n := runtime.Stack(buf, true)
			if n < len(buf) {
				return strings.Count(string(buf[:n]), "examples/benchllm.contend in goroutine")
			}
			buf = make([]byte, 2*len(buf))
		}
	}
	for _, load := range []string{"cpu", "mem", "cpu-paced", "mem-paced"} {
		if !contendLoad(load) {
			t.Fatalf("contendLoad(%q) is false", load)
		}
		if got := loads(); got != 0 {
			t.Fatalf("%s: %d load goroutines before the load starts, want 0", load, got)
		}
		stop := contend(load)
		time.Sleep(20 * time.Millisecond)
		if got := loads(); got != 1 {
			t.Errorf("%s: %d load goroutines while the load runs, want 1", load, got)
		}
		done := make(chan struct{})
		go func() {
			stop()
			close(done)
		}()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Fatalf("%s: stop did not return in 10 s", load)
		}
		// stop returned after the load's goroutine closed done: it may
		// still be unwinding, for a moment.
		for end := time.Now().Add(5 * time.Second); loads() > 0 && time.Now().Before(end); {
			time.Sleep(time.Millisecond)
		}
		if got := loads(); got != 0 {
			t.Errorf("%s: %d load goroutines after stop, want 0", load, got)
		}
	}
}

// TestStartCPUProfile: -cpuprofile writes a profile (gzip-compressed,
// not empty); "" profiles nothing; a path that cannot be created is an error
// naming the flag.
func TestStartCPUProfile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "cpu.pprof")
	stop, err := startCPUProfile(path)
	if err != nil {
		t.Fatal(err)
	}
	x := 1.0
	for end := time.Now().Add(50 * time.Millisecond); time.Now().Before(end); {
		x = x*1.0000001 + 1e-9
	}
	sink.Store(math.Float64bits(x))
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	// A profile is a gzip-compressed protocol buffer.
	zr, err := gzip.NewReader(f)
	if err != nil {
		t.Fatalf("the profile is not gzip: %v", err)
	}
	if b, err := io.ReadAll(zr); err != nil || len(b) == 0 {
		t.Fatalf("the profile: %d bytes, %v", len(b), err)
	}
	stop, err = startCPUProfile("")
	if err != nil || stop() != nil {
		t.Fatalf("no profile: %v", err)
	}
	if _, err := startCPUProfile(filepath.Join(t.TempDir(), "missing", "cpu.pprof")); err == nil || !strings.Contains(err.Error(), "-cpuprofile") {
		t.Fatalf("a path in a missing directory: %v, want an error naming -cpuprofile", err)
	}
}

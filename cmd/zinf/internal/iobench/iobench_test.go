package iobench

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/zinfio/zinf/aio"
	"github.com/zinfio/zinf/config"
)

var silent = slog.New(slog.DiscardHandler)

// listing returns the names in dir, sorted.
func listing(t *testing.T, dir string) []string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	return names
}

// readOnlyDir mounts a read-only tmpfs (as root, permission bits would not
// stop a write) and unmounts it at the end of the test.
func readOnlyDir(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	if err := unix.Mount("tmpfs", dir, "tmpfs", unix.MS_RDONLY, ""); err != nil {
		t.Skipf("cannot mount a read-only tmpfs here (needs root / CAP_SYS_ADMIN): %v", err)
	}
	t.Cleanup(func() { unix.Unmount(dir, 0) })
	return dir
}

// alignmentOf returns the O_DIRECT alignment of dir, skipping the test when
// the filesystem has no O_DIRECT.
func alignmentOf(t *testing.T, dir string) int {
	t.Helper()
	align, direct, err := aio.ProbeDir(dir, aio.DirectOptional)
	if err != nil || !direct || align < 2 {
		t.Skipf("no O_DIRECT alignment to violate on %s (align %d, direct %v, err %v)", dir, align, direct, err)
	}
	return align
}

func mustContain(t *testing.T, err error, parts ...string) {
	t.Helper()
	if err == nil {
		t.Fatalf("no error; want one mentioning %q", parts)
	}
	for _, p := range parts {
		if !strings.Contains(err.Error(), p) {
			t.Errorf("error %q does not mention %q", err, p)
		}
	}
}

// TestCheckReportsEverything: every problem in one error, before anything
// is written.
func TestCheckReportsEverything(t *testing.T) {
	o := Options{SizeBytes: 0, Op: "copy", Loops: -1, Warmup: -2, FileName: "../escape.dat",
		Engine: aio.Options{Backend: "spdk", BlockSizeBytes: 1000, QueueDepth: -1, IntraOpParallelism: 1000}}
	mustContain(t, o.Check(),
		"--path is required", "--size 0", `--op "copy"`, "--loops -1", "--warmup -2", `--file "../escape.dat"`,
		`--backend`, `"spdk"`, "--block-size", "1000", "--queue-depth", "-1", "--parallel", "1000")
}

func TestCheckPath(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "plain")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		dir  string
		want []string
	}{
		{"missing", filepath.Join(dir, "nope"), []string{"--path", "nope", "no such file"}},
		{"file", file, []string{"--path", "not a directory"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := Options{Dir: tc.dir, SizeBytes: 1 << 20, Op: "write"}
			mustContain(t, o.Check(), tc.want...)
		})
	}
	t.Run("read-only", func(t *testing.T) {
		ro := readOnlyDir(t)
		o := Options{Dir: ro, SizeBytes: 1 << 20, Op: "write", Loops: 1}
		_, err := Run(context.Background(), o)
		mustContain(t, err, "--path", ro, "not writable")
		if l := listing(t, ro); len(l) != 0 {
			t.Fatalf("read-only dir now holds %v", l)
		}
	})
}

func TestCheckAlignment(t *testing.T) {
	dir := t.TempDir()
	align := alignmentOf(t, dir)
	small := align / 2 // a power of two aio accepts, below the alignment
	o := Options{Dir: dir, SizeBytes: 1 << 20, Op: "write", Engine: aio.Options{BlockSizeBytes: small, Direct: aio.DirectRequired}}
	mustContain(t, o.Check(), "--block-size", "alignment")
	o = Options{Dir: dir, SizeBytes: 1<<20 + int64(small), Op: "write", Engine: aio.Options{Direct: aio.DirectRequired}}
	mustContain(t, o.Check(), "--size", "alignment")
	// Buffered I/O has no alignment.
	for _, off := range []Options{
		{Dir: dir, SizeBytes: 1<<20 + 1, Op: "write", Engine: aio.Options{BlockSizeBytes: small, Direct: aio.DirectOff}},
		{Dir: dir, SizeBytes: 1<<20 + 1, Op: "write", Naive: true},
	} {
		if err := off.Check(); err != nil {
			t.Errorf("Check(%+v) = %v, want nil", off, err)
		}
	}
	if l := listing(t, dir); len(l) != 0 {
		t.Fatalf("Check left %v behind", l)
	}
}

func checkRun(t *testing.T, r *Result, op string, size int64, loops int) {
	t.Helper()
	if r.Op != op || r.Bytes != size || r.Loops != loops || len(r.GBps) != loops {
		t.Fatalf("result %+v: want op %s, %d bytes, %d loops", r, op, size, loops)
	}
	for _, g := range r.GBps {
		if !(g > 0) || math.IsInf(g, 0) {
			t.Fatalf("bandwidth %v in %v", g, r.GBps)
		}
	}
	if !(r.GBpsMin <= r.GBpsMedian && r.GBpsMedian <= r.GBpsMax) || r.GBpsMin != slices.Min(r.GBps) || r.GBpsMax != slices.Max(r.GBps) {
		t.Fatalf("min %v median %v max %v of %v", r.GBpsMin, r.GBpsMedian, r.GBpsMax, r.GBps)
	}
}

// TestRunEveryBackend writes then reads a small file with every available
// backend and direct policy; the file is removed unless Keep.
func TestRunEveryBackend(t *testing.T) {
	ctx := context.Background()
	for _, b := range aio.Backends {
		for _, d := range []aio.DirectPolicy{aio.DirectOptional, aio.DirectOff} {
			t.Run(b+"-"+d.String(), func(t *testing.T) {
				if err := aio.Available(b); err != nil {
					t.Skipf("backend %s unavailable here: %v", b, err)
				}
				dir := t.TempDir()
				for _, op := range []string{"write", "read"} {
					r, err := Run(ctx, Options{Dir: dir, SizeBytes: 2 << 20, Op: op, Loops: 2, Warmup: 1, Logger: silent,
						Engine: aio.Options{Backend: b, BlockSizeBytes: 256 << 10, QueueDepth: 4, IntraOpParallelism: 2, Direct: d}})
					if err != nil {
						t.Fatalf("%s: %v", op, err)
					}
					checkRun(t, r, op, 2<<20, 2)
					if r.Backend != b {
						t.Fatalf("backend %q, want %q", r.Backend, b)
					}
					if d == aio.DirectOff && (r.Direct || r.AlignBytes != 1) {
						t.Fatalf("--direct off: direct %v align %d", r.Direct, r.AlignBytes)
					}
					if l := listing(t, dir); len(l) != 0 {
						t.Fatalf("after %s: %v left behind", op, l)
					}
				}
			})
		}
	}
}

func TestRunKeepAndNaive(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	var progress bytes.Buffer
	r, err := Run(ctx, Options{Dir: dir, SizeBytes: 1 << 20, Op: "write", Loops: 3, Warmup: 0, Keep: true, FileName: "kept.dat",
		Progress: &progress, Logger: silent, Engine: aio.Options{Backend: aio.BackendPosix}})
	if err != nil {
		t.Fatal(err)
	}
	checkRun(t, r, "write", 1<<20, 3)
	if got := strings.Count(progress.String(), "write loop"); got != 3 {
		t.Fatalf("progress has %d loop lines, want 3:\n%s", got, progress.String())
	}
	if l := listing(t, dir); !slices.Equal(l, []string{"kept.dat"}) {
		t.Fatalf("with Keep: %v, want [kept.dat]", l)
	}
	// A read of an existing file leaves it in place even without Keep.
	for _, naive := range []bool{false, true} {
		r, err = Run(ctx, Options{Dir: dir, SizeBytes: 1 << 20, Op: "read", Loops: 1, FileName: "kept.dat", Naive: naive, Logger: silent})
		if err != nil {
			t.Fatal(err)
		}
		checkRun(t, r, "read", 1<<20, 1)
		if l := listing(t, dir); !slices.Equal(l, []string{"kept.dat"}) {
			t.Fatalf("after a read (naive %v): %v, want [kept.dat]", naive, l)
		}
	}
	if r.Backend != "naive-go" || r.Pinned || r.Direct || !(r.ElapsedSecs > 0) {
		t.Fatalf("naive result %+v", r)
	}
	r, err = Run(ctx, Options{Dir: dir, SizeBytes: 1<<20 + 3, Op: "write", Loops: 1, Naive: true, Logger: silent})
	if err != nil {
		t.Fatal(err)
	}
	checkRun(t, r, "write", 1<<20+3, 1)
	if l := listing(t, dir); !slices.Equal(l, []string{"kept.dat"}) {
		t.Fatalf("naive write left %v", l)
	}
}

func TestRunCanceled(t *testing.T) {
	dir := t.TempDir()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := Run(ctx, Options{Dir: dir, SizeBytes: 1 << 20, Op: "write", Loops: 1, Logger: silent})
	if err == nil {
		t.Fatal("a canceled run succeeded")
	}
	if l := listing(t, dir); len(l) != 0 {
		t.Fatalf("a canceled run left %v", l)
	}
}

func tinyTune(dir string, progress *bytes.Buffer) TuneOptions {
	return TuneOptions{Dir: dir, SizeBytes: 1 << 20, Loops: 1, Backends: []string{aio.BackendPosix},
		BlockSizes: []int{256 << 10}, Depths: []int{4}, Parallel: []int{1}, Progress: progress}
}

// TestTune runs the smallest sweep and checks the table, the best row, the
// progress count and that the config section is exact and parses.
func TestTune(t *testing.T) {
	dir := t.TempDir()
	var progress bytes.Buffer
	res, err := Tune(context.Background(), tinyTune(dir, &progress))
	if err != nil {
		t.Fatal(err)
	}
	// Stage 1: one row; stage 2: single_submit x overlap_events less the one
	// measured already.
	if len(res.Rows) != 4 {
		t.Fatalf("%d rows, want 4: %+v", len(res.Rows), res.Rows)
	}
	for _, r := range res.Rows {
		if r.Score() > res.Best.Score() {
			t.Fatalf("row %+v beats the best %+v", r, res.Best)
		}
		if !(r.ReadGBps > 0 && r.WriteGBps > 0) {
			t.Fatalf("row %+v has no bandwidth", r)
		}
	}
	if !strings.Contains(progress.String(), "[  4/4]") || strings.Count(progress.String(), "\n") != 4 {
		t.Fatalf("progress:\n%s", progress.String())
	}
	if l := listing(t, dir); len(l) != 0 {
		t.Fatalf("tune left %v", l)
	}
	var table bytes.Buffer
	if err := res.WriteTable(&table); err != nil {
		t.Fatal(err)
	}
	if lines := strings.Split(strings.TrimSpace(table.String()), "\n"); len(lines) != 5 || !strings.Contains(lines[0], "write GB/s") {
		t.Fatalf("table:\n%s", table.String())
	}

	sec, err := res.ConfigSection()
	if err != nil {
		t.Fatal(err)
	}
	var got struct {
		AIO  map[string]any `json:"aio"`
		Zinf map[string]any `json:"zinf"`
	}
	if err := json.Unmarshal(sec, &got); err != nil {
		t.Fatalf("config section is not JSON: %v\n%s", err, sec)
	}
	b := res.Best
	want := map[string]any{"block_size": float64(b.BlockSize), "queue_depth": float64(b.QueueDepth),
		"intra_op_parallelism": float64(b.Parallel), "single_submit": b.SingleSubmit, "overlap_events": b.Overlap}
	for k, v := range want {
		if got.AIO[k] != v {
			t.Errorf("aio.%s = %#v, want %#v", k, got.AIO[k], v)
		}
	}
	if got.Zinf["backend"] != aio.BackendPosix {
		t.Errorf("zinf.backend = %#v, want posix", got.Zinf["backend"])
	}
	cfg, err := config.Parse(sec)
	if err != nil {
		t.Fatalf("config.Parse rejects the section: %v\n%s", err, sec)
	}
	if int(cfg.AIO.BlockSize) != b.BlockSize || cfg.AIO.QueueDepth != b.QueueDepth || cfg.AIO.IntraOpParallelism != b.Parallel ||
		cfg.AIO.SingleSubmit != b.SingleSubmit || cfg.AIO.OverlapEvents != b.Overlap || string(cfg.Zinf.Backend) != b.Backend {
		t.Fatalf("parsed config %+v / %+v does not reproduce %+v", cfg.AIO, cfg.Zinf, b)
	}
}

// TestTuneProgressTotal: without parallelism 1 in the list, stage 2
// measures all four variants and the progress count says so.
func TestTuneProgressTotal(t *testing.T) {
	var progress bytes.Buffer
	o := tinyTune(t.TempDir(), &progress)
	o.Parallel = []int{2}
	res, err := Tune(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Rows) != 5 || !strings.Contains(progress.String(), "[  5/5]") {
		t.Fatalf("%d rows; progress:\n%s", len(res.Rows), progress.String())
	}
}

// TestTuneCheck: a bad grid is reported whole before the first run.
func TestTuneCheck(t *testing.T) {
	dir := t.TempDir()
	align := alignmentOf(t, dir)
	o := TuneOptions{Dir: dir, SizeBytes: 1 << 20, Loops: 1, Backends: []string{aio.BackendPosix, "spdk"},
		BlockSizes: []int{256 << 10, 1000, align / 2}, Depths: []int{4, 0}, Parallel: []int{1, 65}, Direct: aio.DirectRequired}
	_, err := Tune(context.Background(), o)
	mustContain(t, err, `--backends: "spdk"`, "--block-sizes", "1000", "alignment", "--queue-depths: 0", "--parallel: 65")
	if l := listing(t, dir); len(l) != 0 {
		t.Fatalf("a rejected sweep left %v", l)
	}
	o = TuneOptions{Dir: filepath.Join(dir, "missing"), Loops: -1}
	mustContain(t, o.Check(), "--path", "--loops -1")
}

// TestCompare runs one tiny interleaved round against fio when it is
// installed.
func TestCompare(t *testing.T) {
	fio, err := exec.LookPath("fio")
	if err != nil {
		t.Skipf("fio is not installed (apt-get install -y fio): %v", err)
	}
	dir := t.TempDir()
	if _, direct, err := aio.ProbeDir(dir, aio.DirectOptional); err != nil || !direct {
		t.Skipf("no O_DIRECT on %s, which the comparison requires", dir)
	}
	var progress bytes.Buffer
	res, err := Compare(context.Background(), CompareOptions{Dir: dir, SizeBytes: 16 << 20, Rounds: 1, FioPath: fio, Progress: &progress})
	if err != nil {
		t.Fatal(err)
	}
	var table bytes.Buffer
	if err := res.WriteTable(&table); err != nil {
		t.Fatal(err)
	}
	out := table.String()
	if !strings.Contains(out, "zinf/fio") || !strings.Contains(out, "naive-go") {
		t.Fatalf("table:\n%s", out)
	}
	paired := 0
	for _, p := range res.Pairs {
		if p.Fio == "" {
			continue
		}
		paired++
		if len(p.ZinfGBps) != 1 || len(p.FioGBps) != 1 || !(p.Ratio() > 0) {
			t.Errorf("pair %+v: want one figure each and a positive ratio", p)
		}
	}
	for _, b := range []string{aio.BackendUring, aio.BackendLibaio} {
		if aio.Available(b) == nil && !strings.Contains(out, b) {
			t.Errorf("available backend %s missing from the table:\n%s", b, out)
		}
	}
	if paired == 0 {
		t.Skipf("neither io_uring nor libaio is available here; nothing to pair with fio:\n%s", progress.String())
	}
	if l := listing(t, dir); len(l) != 0 {
		t.Fatalf("compare left %v", l)
	}
}

func TestCompareRejectsBadInput(t *testing.T) {
	dir := t.TempDir()
	_, err := Compare(context.Background(), CompareOptions{Dir: dir, SizeBytes: 1 << 20, Rounds: 1, FioPath: filepath.Join(dir, "no-fio")})
	mustContain(t, err, "--fio", "no-fio")
	_, err = Compare(context.Background(), CompareOptions{Dir: filepath.Join(dir, "missing"), SizeBytes: 1 << 20, Rounds: 1, FioPath: "/bin/true"})
	mustContain(t, err, "--path", "missing")
	_, err = Compare(context.Background(), CompareOptions{Dir: dir, Rounds: -1, FioPath: "/bin/true"})
	mustContain(t, err, "--rounds -1")
	if l := listing(t, dir); len(l) != 0 {
		t.Fatalf("rejected comparisons left %v", l)
	}
}

func TestPairRatio(t *testing.T) {
	p := Pair{ZinfGBps: []float64{1, 3, 2}, FioGBps: []float64{4, 4}}
	if got := p.Ratio(); got != 0.5 {
		t.Fatalf("Ratio = %v, want 0.5", got)
	}
	if got := (Pair{ZinfGBps: []float64{1}}).Ratio(); got != 0 {
		t.Fatalf("Ratio without fio figures = %v, want 0", got)
	}
}

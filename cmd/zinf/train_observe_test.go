package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/zinfio/zinf/internal/test/promscrape"
	"github.com/zinfio/zinf/internal/test/tracecheck"
)

// TestTrainTrace: zinf train --trace writes a file that validates against
// the trace-event format and holds, per step, every layer's forward and
// backward compute, the optimizer step, and swap-ins and swap-outs of
// every store; --trace-steps keeps the first steps only.
func TestTrainTrace(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "run.trace.json")
	code, out, errs := runCLI(t, "train", "--layers", "3", "--width", "32", "--steps", "2", "--json", "--dir", dir, "--trace", file)
	if code != 0 {
		t.Fatalf("exit %d:\n%s", code, errs)
	}
	if !strings.HasPrefix(strings.TrimSpace(out), "{") {
		t.Fatalf("stdout is not only the JSON result:\n%s", out)
	}
	wantAll(t, "stderr", errs, "trace: ", "events in "+file, "ui.perfetto.dev")
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	sum, err := tracecheck.Validate(data)
	if err != nil {
		t.Fatalf("invalid trace: %v", err)
	}
	count := map[string]int{}
	for _, sp := range sum.Spans {
		step := int(sp.Args["step"].(float64))
		where, _ := sp.Args["where"].(string)
		switch sp.Cat {
		case "compute", "step":
			count[fmt.Sprintf("%d %s", step, sp.Name)]++
		case "read", "write":
			count[fmt.Sprintf("%s %s", where, sp.Cat)]++
		}
	}
	for step := 1; step <= 2; step++ {
		for l := range 3 {
			for _, pass := range []string{"forward", "backward"} {
				if n := count[fmt.Sprintf("%d %s L%d", step, pass, l)]; n != 1 {
					t.Errorf("step %d: %d %s spans of layer %d, want 1", step, n, pass, l)
				}
			}
		}
		if n := count[fmt.Sprintf("%d step %d", step, step)]; n != 1 {
			t.Errorf("%d spans of step %d, want 1", n, step)
		}
	}
	for _, k := range []string{"param read", "param write", "optim read", "optim write"} {
		if count[k] == 0 {
			t.Errorf("no %s in the trace (counts: %v)", k, count)
		}
	}
	// The default pool keeps this model's gradients in pinned memory
	// (zinf.pinned_grads auto): none goes to NVMe.
	for _, k := range []string{"grad write", "grad read"} {
		if count[k] != 0 {
			t.Errorf("%d %s spans: the gradients should stay in pinned memory (counts: %v)", count[k], k, count)
		}
	}

	// --trace-steps 1: nothing of step 2.
	file1 := filepath.Join(dir, "first.trace.json")
	if code, _, errs := runCLI(t, "train", "--layers", "2", "--width", "16", "--steps", "3", "--quiet", "--dir", dir, "--trace", file1, "--trace-steps", "1"); code != 0 {
		t.Fatalf("exit %d:\n%s", code, errs)
	}
	data, _ = os.ReadFile(file1)
	sum, err = tracecheck.Validate(data)
	if err != nil {
		t.Fatal(err)
	}
	for _, sp := range sum.Spans {
		if sp.Args["step"].(float64) != 1 {
			t.Fatalf("--trace-steps 1 kept %q of step %v", sp.Name, sp.Args["step"])
		}
	}
}

// TestTrainObserveBadFlags: an existing --trace file is refused and left
// as it was (zinf writes only files it creates); --trace-steps needs
// --trace; empty values and an address that cannot be listened on are
// named.
func TestTrainObserveBadFlags(t *testing.T) {
	dir := t.TempDir()
	mine := filepath.Join(dir, "mine.json")
	if err := os.WriteFile(mine, []byte("keep me"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		args []string
		want []string
	}{
		{[]string{"--trace", mine}, []string{"--trace " + mine + " already exists"}},
		{[]string{"--trace-steps", "2"}, []string{"--trace-steps needs --trace"}},
		{[]string{"--trace", filepath.Join(dir, "t.json"), "--trace-steps", "-1"}, []string{"--trace-steps -1"}},
		{[]string{"--trace", ""}, []string{`--trace ""`}},
		{[]string{"--metrics-addr", ""}, []string{`--metrics-addr ""`}},
		{[]string{"--metrics-addr", "256.1.1.1:x"}, []string{"--metrics-addr 256.1.1.1:x"}},
	} {
		code, _, errs := runCLI(t, append([]string{"train", "--layers", "1", "--width", "8", "--steps", "1", "--dir", dir}, c.args...)...)
		if code == 0 {
			t.Errorf("%v: exit 0", c.args)
			continue
		}
		wantAll(t, fmt.Sprint(c.args), errs, c.want...)
	}
	if b, _ := os.ReadFile(mine); string(b) != "keep me" {
		t.Fatalf("the existing file was changed: %q", b)
	}
	if _, err := os.Stat(filepath.Join(dir, "t.json")); err == nil {
		t.Fatal("a refused run created its trace file")
	}
}

// TestTrainMetricsScrape runs zinf train --metrics-addr 127.0.0.1:0 and
// scrapes /metrics while it trains: the NVMe tier's byte counters (reads
// and writes) grow from one scrape to a later one during the run.
func TestTrainMetricsScrape(t *testing.T) {
	dir := t.TempDir()
	var stdout, stderr syncBuffer
	done := make(chan int, 1)
	go func() {
		// About 40 steps of 8 layers x 2 passes x 5 ms of simulated
		// compute: several seconds to scrape in.
		done <- run([]string{"train", "--layers", "8", "--width", "64", "--steps", "40", "--compute-ms-per-layer", "5", "--quiet",
			"--dir", dir, "--metrics-addr", "127.0.0.1:0"}, &stdout, &stderr)
	}()
	addrRE := regexp.MustCompile(`metrics: serving (http://\S+/metrics)`)
	var url string
	deadline := time.After(2 * time.Minute)
	for url == "" {
		if m := addrRE.FindStringSubmatch(stderr.String()); m != nil {
			url = m[1]
			break
		}
		select {
		case code := <-done:
			t.Fatalf("train ended (exit %d) before serving metrics:\n%s", code, stderr.String())
		case <-deadline:
			t.Fatalf("no metrics address printed:\n%s", stderr.String())
		case <-time.After(10 * time.Millisecond):
		}
	}
	series := []map[string]string{{"op": "read"}, {"op": "write"}}
	first := make([]float64, len(series))
	var grew []bool
	scrapes := 0
	for grew == nil || !(grew[0] && grew[1]) {
		got, err := promscrape.Get(url)
		if err != nil {
			select {
			case code := <-done:
				t.Fatalf("train ended (exit %d) while nvme counters grew only %v over %d scrapes:\n%s", code, grew, scrapes, stderr.String())
			default:
				t.Fatalf("scrape %d: %v", scrapes+1, err)
			}
		}
		scrapes++
		for i, m := range series {
			v, _ := got.Sum("zinf_nvme_bytes_total", m)
			if grew == nil {
				first[i] = v
				continue
			}
			grew[i] = grew[i] || v > first[i]
		}
		if grew == nil {
			grew = make([]bool, len(series))
		}
		time.Sleep(50 * time.Millisecond)
	}
	if code := <-done; code != 0 {
		t.Fatalf("train: exit %d\n%s", code, stderr.String())
	}
	t.Logf("%d scrapes", scrapes)
}

// TestTrainEndurance: zinf train reports the NVMe bytes a step writes —
// every parameter's updated value and optimizer states (4 + 12 bytes in
// fp32; the gradients stay in pinned memory, zinf.pinned_grads), padded to
// the device alignment per tensor — and sets them per day against --tbw.
func TestTrainEndurance(t *testing.T) {
	dir := t.TempDir()
	code, out, errs := runCLI(t, "train", "--layers", "2", "--width", "64", "--steps", "3", "--json", "--dir", dir)
	if code != 0 {
		t.Fatalf("exit %d:\n%s", code, errs)
	}
	var res struct {
		Written int64 `json:"nvme_written_per_step_bytes"`
		Params  int64 `json:"params"`
	}
	if err := json.Unmarshal([]byte(out), &res); err != nil {
		t.Fatal(err)
	}
	lo := 16 * res.Params
	hi := lo + 4*2*4096 // 4 tensors in 2 stores, each padded by less than 4 KiB
	if res.Written < lo || res.Written > hi {
		t.Fatalf("%d bytes written per step, want %d..%d", res.Written, lo, hi)
	}
	code, out, errs = runCLI(t, "train", "--layers", "2", "--width", "64", "--steps", "3", "--quiet", "--dir", dir, "--tbw", "600TB")
	if code != 0 {
		t.Fatalf("exit %d:\n%s", code, errs)
	}
	wantAll(t, "summary", out, "nvme endurance (all ranks, at the median step measured)", "written per step", "per day", "of a 600 TB endurance rating")
}

// TestMetricsAllInterfacesWarns is the regression for --metrics-addr :0
// (or 0.0.0.0:PORT) binding every interface without a word: one warning
// line says so; an address on one interface gets none.
func TestMetricsAllInterfacesWarns(t *testing.T) {
	const warning = "listens on all network interfaces"
	for _, c := range []struct {
		addr string
		warn bool
	}{{":0", true}, {"0.0.0.0:0", true}, {"127.0.0.1:0", false}} {
		code, out, errs := runCLI(t, "train", "--layers", "2", "--width", "64", "--steps", "1", "--quiet", "--dir", t.TempDir(), "--metrics-addr", c.addr)
		if code != 0 {
			t.Fatalf("--metrics-addr %s: exit %d:\n%s\n%s", c.addr, code, out, errs)
		}
		if n := strings.Count(errs, warning); n != map[bool]int{true: 1, false: 0}[c.warn] {
			t.Errorf("--metrics-addr %s: %d warnings, want warn=%v:\n%s", c.addr, n, c.warn, errs)
		} else if c.warn && !strings.Contains(errs, "--metrics-addr "+c.addr+" "+warning) {
			t.Errorf("--metrics-addr %s: the warning does not name the flag's value:\n%s", c.addr, errs)
		}
	}
}

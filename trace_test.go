package zinf_test

import (
	"bytes"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/zinfio/zinf"
	"github.com/zinfio/zinf/comm"
	"github.com/zinfio/zinf/config"
	"github.com/zinfio/zinf/internal/test/tracecheck"
	"github.com/zinfio/zinf/metrics"
	"github.com/zinfio/zinf/swapper"
	"github.com/zinfio/zinf/tensor"
	"github.com/zinfio/zinf/trace"
)

// TestTrace trains two ranks through the README's loop with a
// trace.ChromeWriter in Options.Trace and checks the file: it is valid
// trace-event JSON (tracecheck), each rank is a process, every layer's
// forward and backward compute appears once per step with its barrier
// wait, every gradient hand-off and every optimizer step appears, each
// step's compute comes before its step, and the bytes of the traced swap
// store reads and writes add up, per rank and store, to what the stores
// counted themselves.
func TestTrace(t *testing.T) {
	ctx, watch := watchdog(t, 5*time.Minute)
	cfg, _ := testConfig(t)
	model := zinf.LayeredModel(
		[]tensor.Desc{{Name: "l0.w", Shape: []int{64, 96}}, {Name: "l0.b", Shape: []int{64}}},
		[]tensor.Desc{{Name: "l1.w", Shape: []int{96, 64}}},
		[]tensor.Desc{{Name: "l2.w", Shape: []int{33, 7}}, {Name: "l2.b", Shape: []int{33}}},
	)
	var buf bytes.Buffer
	tw := trace.NewChromeWriter(&buf, trace.ChromeOptions{})
	start := time.Now()
	var rts []*zinf.Runtime
	for r := range 2 {
		rt, err := zinf.Open(cfg, model, zinf.Options{Rank: r, WorldSize: 2, Trace: tw})
		if err != nil {
			t.Fatal(err)
		}
		defer rt.Close()
		rts = append(rts, rt)
	}
	watch(rts...)
	init := initValues(model)
	initAll(ctx, t, rts, init)
	const steps = 3
	trainLoop(ctx, t, rts, newAdamRef(cfg, init), steps)
	type storeBytes struct{ read, written int64 }
	counted := map[string]storeBytes{}
	for _, rt := range rts {
		for name, s := range map[string]*swapper.Store{"param": rt.ParamStore, "grad": rt.GradStore, "optim": rt.OptimStore} {
			st := s.Stats()
			counted[fmt.Sprintf("%d/%s", rt.Rank, name)] = storeBytes{st.BytesRead, st.BytesWritten}
		}
	}
	for _, rt := range rts {
		if err := rt.Close(); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	end := time.Now()
	sum, err := tracecheck.Validate(buf.Bytes())
	if err != nil {
		t.Fatalf("invalid trace: %v", err)
	}
	if sum.ProcessNames[0] != "zinf rank 0" || sum.ProcessNames[1] != "zinf rank 1" {
		t.Fatalf("processes %v", sum.ProcessNames)
	}
	type key struct {
		rank       int64
		cat, name  string
		step       int
		tensor, on string
	}
	count := map[key]int{}
	traced := map[string]storeBytes{}
	stepAt := map[[2]int64]tracecheck.Span{}
	lastCompute := map[[2]int64]float64{}
	maxTs := float64(end.Sub(start).Microseconds())
	for _, sp := range sum.Spans {
		step := int(sp.Args["step"].(float64))
		tensorName, _ := sp.Args["tensor"].(string)
		where, _ := sp.Args["where"].(string)
		count[key{sp.Pid, sp.Cat, sp.Name, step, tensorName, where}]++
		if sp.Ts < 0 || sp.End() > maxTs+1 {
			t.Fatalf("%q [%.1f, %.1f] µs outside the run's %.1f µs", sp.Name, sp.Ts, sp.End(), maxTs)
		}
		switch sp.Cat {
		case "read", "write":
			if sp.Args["failed"] == true {
				t.Fatalf("failed I/O traced in a run without faults: %+v", sp)
			}
			k := fmt.Sprintf("%d/%s", sp.Pid, where)
			b := traced[k]
			if sp.Cat == "read" {
				b.read += int64(sp.Args["bytes"].(float64))
			} else {
				b.written += int64(sp.Args["bytes"].(float64))
			}
			traced[k] = b
		case "step":
			stepAt[[2]int64{sp.Pid, int64(step)}] = sp
		case "compute":
			k := [2]int64{sp.Pid, int64(step)}
			lastCompute[k] = max(lastCompute[k], sp.End())
		}
	}
	for rank := range int64(2) {
		for step := 1; step <= steps+1; step++ {
			for l := range 3 {
				passes := []string{"forward", "backward"}
				if step == steps+1 {
					passes = passes[:1] // the read-back after the last step
				}
				for _, pass := range passes {
					if n := count[key{rank, "compute", fmt.Sprintf("%s L%d", pass, l), step, "", pass}]; n != 1 {
						t.Errorf("rank %d step %d: %d %s spans of layer %d, want 1", rank, step, n, pass, l)
					}
					if n := count[key{rank, "wait", fmt.Sprintf("wait L%d", l), step, "", "layer"}]; n != len(passes) {
						t.Errorf("rank %d step %d: %d barrier waits of layer %d, want %d", rank, step, n, l, len(passes))
					}
				}
			}
			if step > steps {
				continue
			}
			for _, d := range model.Tensors {
				if n := count[key{rank, "wait", "wait gradient " + d.Name, step, d.Name, "gradient"}]; n != 1 {
					t.Errorf("rank %d step %d: %d gradient hand-offs of %s, want 1", rank, step, n, d.Name)
				}
			}
			sp, ok := stepAt[[2]int64{rank, int64(step)}]
			if !ok || sp.Name != fmt.Sprintf("step %d", step) {
				t.Fatalf("rank %d: no span for step %d (%+v)", rank, step, sp)
			}
			if c := lastCompute[[2]int64{rank, int64(step)}]; c > sp.Ts {
				t.Errorf("rank %d step %d: compute ends at %.1f µs, after the step began at %.1f", rank, step, c, sp.Ts)
			}
		}
	}
	for k, want := range counted {
		if traced[k] != want {
			t.Errorf("%s: traced bytes read/written %+v, the store counted %+v", k, traced[k], want)
		}
	}
	// The optimizer's sub-groups (one per tensor here): per rank, step and
	// tensor a read of its record and gradient (12 + 4 bytes per element
	// of the rank's partition), then its update, then its write-behind,
	// all inside the step's span.
	type sgKey struct {
		rank   int64
		step   int
		tensor string
	}
	stages := map[sgKey]map[string]tracecheck.Span{}
	for _, sp := range sum.Spans {
		if !strings.HasPrefix(sp.Cat, "optimizer ") {
			continue
		}
		k := sgKey{sp.Pid, int(sp.Args["step"].(float64)), sp.Args["tensor"].(string)}
		if stages[k] == nil {
			stages[k] = map[string]tracecheck.Span{}
		}
		if _, dup := stages[k][sp.Cat]; dup {
			t.Fatalf("%+v: two %s spans", k, sp.Cat)
		}
		stages[k][sp.Cat] = sp
	}
	for _, rt := range rts {
		for step := 1; step <= steps; step++ {
			for _, d := range model.Tensors {
				k := sgKey{int64(rt.Rank), step, d.Name}
				rd, up, wr := stages[k]["optimizer read"], stages[k]["optimizer update"], stages[k]["optimizer write"]
				lo, hi := rt.Partition(d.Name)
				if rd.Name == "" || up.Name == "" || wr.Name == "" {
					t.Errorf("%+v: stages %v", k, stages[k])
					continue
				}
				if got, want := int64(rd.Args["bytes"].(float64)), int64(16*(hi-lo)); got != want {
					t.Errorf("%+v: read %d bytes, want %d", k, got, want)
				}
				st := stepAt[[2]int64{k.rank, int64(step)}]
				if up.Ts+1e-3 < rd.End() || wr.Ts+1e-3 < up.End() || wr.End() > st.End()+1e-3 {
					t.Errorf("%+v: read [%.1f, %.1f], update [%.1f, %.1f], write [%.1f, %.1f], step ends %.1f", k,
						rd.Ts, rd.End(), up.Ts, up.End(), wr.Ts, wr.End(), st.End())
				}
			}
		}
	}
}

// TestTraceConcurrentSink: ranks trained on their own goroutines share one
// ChromeWriter; the file stays valid.
func TestTraceConcurrentSink(t *testing.T) {
	ctx, watch := watchdog(t, 5*time.Minute)
	cfg, _ := testConfig(t)
	cfg.Zinf.Tiers.CPUPinnedBytes = 32 << 20
	model := readmeModel()
	var buf bytes.Buffer
	tw := trace.NewChromeWriter(&buf, trace.ChromeOptions{})
	init := initValues(model)
	var wg sync.WaitGroup
	errc := make(chan error, 2)
	for r := range 2 {
		rt, err := zinf.Open(cfg, model, zinf.Options{Rank: r, WorldSize: 2, Trace: tw})
		if err != nil {
			t.Fatal(err)
		}
		defer rt.Close()
		watch(rt)
		wg.Add(1)
		go func() {
			defer wg.Done()
			errc <- func() error {
				for _, d := range model.Tensors {
					if err := rt.Init(ctx, d.Name, init[d.Name]); err != nil {
						return err
					}
				}
				for range 2 {
					rt.Forward()
					for l := range rt.Layers() {
						if err := rt.BeginLayer(ctx, l); err != nil {
							return err
						}
						rt.EndLayer(l)
					}
					rt.Backward()
					for l := rt.Layers() - 1; l >= 0; l-- {
						if err := rt.BeginLayer(ctx, l); err != nil {
							return err
						}
						for _, name := range rt.LayerTensors(l) {
							if err := rt.AccumulateGrad(ctx, name, gradOf(init[name])); err != nil {
								return err
							}
						}
						if err := rt.StepLayer(ctx, l); err != nil {
							return err
						}
						rt.EndLayer(l)
					}
					if err := rt.Step(ctx); err != nil {
						return err
					}
				}
				return rt.Close()
			}()
		}()
	}
	wg.Wait()
	close(errc)
	for err := range errc {
		if err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	sum, err := tracecheck.Validate(buf.Bytes())
	if err != nil {
		t.Fatalf("invalid trace: %v", err)
	}
	steps := map[int64]int{}
	for _, sp := range sum.Spans {
		if sp.Cat == "step" {
			steps[sp.Pid]++
		}
	}
	if steps[0] != 2 || steps[1] != 2 {
		t.Fatalf("step spans per rank: %v, want 2 each", steps)
	}
}

// TestTraceRollback: with clipping that triggers on every step and
// speculation always on, each step's update begun during backward is
// rolled back; the trace has one rollback per rollback the runtime
// counts, inside its step's span, and the metrics collector exports the
// same count.
func TestTraceRollback(t *testing.T) {
	c, _ := testConfig(t)
	c.Zinf.Tiers.CPUPinnedBytes = 32 << 20
	c.GradientClipping = 1e-3
	c.Zinf.Speculate = config.SpeculateAlways
	var buf bytes.Buffer
	tw := trace.NewChromeWriter(&buf, trace.ChromeOptions{})
	ctx, rt, m := openTwoLayers(t, c, zinf.Options{Trace: tw})
	defer rt.Close()
	if !rt.Placement().OverlapStep {
		t.Skip("the plan has no room to overlap the step here")
	}
	const steps = 3
	for step := range steps {
		stepOnce(t, ctx, rt, gradsFor(m, step, 1), true)
	}
	tr := rt.Metrics().Train
	if tr.Rollbacks != steps {
		t.Fatalf("%d rollbacks counted, want %d (%+v)", tr.Rollbacks, steps, tr)
	}
	scraped := testutil.ToFloat64(onlyRollbacks{metrics.New(rt)})
	rt.Close()
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	sum, err := tracecheck.Validate(buf.Bytes())
	if err != nil {
		t.Fatalf("invalid trace: %v", err)
	}
	stepSpan := map[float64]tracecheck.Span{}
	var rb []tracecheck.Span
	for _, sp := range sum.Spans {
		switch sp.Cat {
		case "step":
			stepSpan[sp.Args["step"].(float64)] = sp
		case "rollback":
			rb = append(rb, sp)
		}
	}
	if len(rb) != steps || scraped != steps {
		t.Fatalf("%d rollbacks traced, %v scraped; the runtime counted %d", len(rb), scraped, steps)
	}
	for _, r := range rb {
		s, ok := stepSpan[r.Args["step"].(float64)]
		if !ok || r.Ts < s.Ts || r.End() > s.End()+0.001 || r.Name != fmt.Sprintf("rollback step %v", r.Args["step"]) {
			t.Fatalf("rollback %+v is not inside its step %+v", r, s)
		}
	}
}

// onlyRollbacks keeps zinf_rollbacks_total of a collector, for
// testutil.ToFloat64.
type onlyRollbacks struct{ c prometheus.Collector }

func (o onlyRollbacks) Describe(ch chan<- *prometheus.Desc) { o.c.Describe(ch) }

func (o onlyRollbacks) Collect(ch chan<- prometheus.Metric) {
	all := make(chan prometheus.Metric)
	go func() { o.c.Collect(all); close(all) }()
	for m := range all {
		if strings.Contains(m.Desc().String(), `"zinf_rollbacks_total"`) {
			ch <- m
		}
	}
}

// TestTraceGatheredLayers: with GatherLayers (each rank reads whole
// parameters gathered from every rank), each layer's barrier wait and
// compute are on the timeline too.
func TestTraceGatheredLayers(t *testing.T) {
	ctx, watch := watchdog(t, 5*time.Minute)
	cfg, _ := testConfig(t)
	cfg.Zinf.Tiers.CPUPinnedBytes = 32 << 20
	model := readmeModel()
	init := initValues(model)
	comms, err := comm.NewLocal(2, comm.LocalOptions{StallTimeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	tw := trace.NewChromeWriter(&buf, trace.ChromeOptions{})
	rts := make([]*zinf.Runtime, 2)
	for r := range 2 {
		if rts[r], err = zinf.Open(cfg, model, zinf.Options{Rank: r, WorldSize: 2, Comm: comms[r], GatherLayers: true, Trace: tw}); err != nil {
			t.Fatal(err)
		}
		defer rts[r].Close()
		watch(rts[r])
	}
	errs := onRanks(2, func(r int) error {
		rt := rts[r]
		for name, w := range init {
			if err := rt.Init(ctx, name, w); err != nil {
				return err
			}
		}
		rt.Forward()
		for l := range rt.Layers() {
			if err := rt.BeginLayer(ctx, l); err != nil {
				return err
			}
			rt.EndLayer(l)
		}
		return nil
	})
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	for _, rt := range rts {
		rt.Close()
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	sum, err := tracecheck.Validate(buf.Bytes())
	if err != nil {
		t.Fatalf("invalid trace: %v", err)
	}
	count := map[string]int{}
	for _, sp := range sum.Spans {
		count[fmt.Sprintf("%d %s", sp.Pid, sp.Name)]++
	}
	for r := range 2 {
		for l := range rts[r].Layers() {
			for _, name := range []string{fmt.Sprintf("forward L%d", l), fmt.Sprintf("wait L%d", l)} {
				if n := count[fmt.Sprintf("%d %s", r, name)]; n != 1 {
					t.Errorf("rank %d: %d %q spans, want 1", r, n, name)
				}
			}
		}
	}
}

package metrics_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/zinfio/zinf"
	"github.com/zinfio/zinf/buffers"
	"github.com/zinfio/zinf/config"
	"github.com/zinfio/zinf/internal/test/promscrape"
	"github.com/zinfio/zinf/metrics"
	"github.com/zinfio/zinf/swapper"
	"github.com/zinfio/zinf/tensor"
)

// open opens one runtime of a small model whose parameters, gradients and
// optimizer states live on NVMe (a temp dir), and gives it initial values.
func open(t *testing.T) (*zinf.Runtime, zinf.Model) {
	t.Helper()
	cfg := config.Default()
	cfg.SetScratchDir(t.TempDir())
	cfg.Zinf.Tiers.CPUPinnedBytes = 16 << 20
	cfg.Zinf.PinnedGrads = config.PinnedGradsOff // every store's series moves
	cfg.ZeroOptimization.OffloadParam.MaxInCPU = 0
	model := zinf.LayeredModel(
		[]tensor.Desc{{Name: "l0.w", Shape: []int{128, 64}}, {Name: "l0.b", Shape: []int{128}}},
		[]tensor.Desc{{Name: "l1.w", Shape: []int{64, 128}}},
	)
	rt, err := zinf.Open(cfg, model, zinf.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rt.Close() })
	for _, d := range model.Tensors {
		n, _ := d.Numel()
		v := make([]float32, n)
		for i := range v {
			v[i] = float32(i%13) / 13
		}
		if err := rt.Init(context.Background(), d.Name, v); err != nil {
			t.Fatal(err)
		}
	}
	return rt, model
}

// step runs one forward, backward and optimizer step.
func step(t *testing.T, rt *zinf.Runtime, model zinf.Model) {
	t.Helper()
	ctx := context.Background()
	rt.Forward()
	for l := range rt.Layers() {
		if err := rt.BeginLayer(ctx, l); err != nil {
			t.Fatal(err)
		}
		rt.EndLayer(l)
	}
	rt.Backward()
	for l := rt.Layers() - 1; l >= 0; l-- {
		if err := rt.BeginLayer(ctx, l); err != nil {
			t.Fatal(err)
		}
		for _, name := range rt.LayerTensors(l) {
			var n int64
			for _, d := range model.Tensors {
				if d.Name == name {
					n, _ = d.Numel()
				}
			}
			g := make([]float32, n)
			for i := range g {
				g[i] = float32(i%5) - 2
			}
			if err := rt.AccumulateGrad(ctx, name, g); err != nil {
				t.Fatal(err)
			}
		}
		if err := rt.StepLayer(ctx, l); err != nil {
			t.Fatal(err)
		}
		rt.EndLayer(l)
	}
	if err := rt.Step(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestScrapeDuringTraining serves a runtime's metrics over HTTP and
// scrapes /metrics between training steps: the NVMe tier's byte and
// operation counters grow with every step, for parameter reads, gradient
// writes and reads and optimizer state reads and writes, and at the end
// they equal what the stores counted themselves, per path; the latency
// histograms count every operation; the CPU tier shows the pinned pool's
// capacity and its use per purpose, the step counter the steps.
func TestScrapeDuringTraining(t *testing.T) {
	rt, model := open(t)
	c := metrics.New(rt)
	srv, err := metrics.Serve("127.0.0.1:0", metrics.NewRegistry(c))
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close(context.Background())
	url := "http://" + srv.Addr() + "/metrics"
	series := []map[string]string{
		{"store": "param", "op": "read"}, {"store": "param", "op": "write"}, {"store": "grad", "op": "write"},
		{"store": "grad", "op": "read"}, {"store": "optim", "op": "read"}, {"store": "optim", "op": "write"},
	}
	var last []float64
	for s := 1; s <= 3; s++ {
		step(t, rt, model)
		got, err := promscrape.Get(url)
		if err != nil {
			t.Fatal(err)
		}
		for i, m := range series {
			for _, name := range []string{"zinf_nvme_bytes_total", "zinf_nvme_ops_total"} {
				v, ok := got.Sum(name, m)
				if !ok {
					t.Fatalf("step %d: no %s%v", s, name, m)
				}
				if name == "zinf_nvme_bytes_total" {
					if s > 1 && v <= last[i] {
						t.Errorf("step %d: %s%v = %v, not above the previous scrape's %v", s, name, m, v, last[i])
					}
					if s == 1 {
						last = append(last, v)
					} else {
						last[i] = v
					}
				}
			}
		}
		if v, _ := got.Sum("zinf_steps_total", nil); v != float64(s) {
			t.Errorf("step %d: zinf_steps_total = %v", s, v)
		}
	}
	// The last scrape against the stores' own counters.
	got, err := promscrape.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	for name, s := range map[string]*swapper.Store{"param": rt.ParamStore, "grad": rt.GradStore, "optim": rt.OptimStore} {
		st := s.Stats()
		for _, p := range st.Paths {
			for op, want := range map[string]int64{"read": p.BytesRead, "write": p.BytesWritten} {
				if v, _ := got.Sum("zinf_nvme_bytes_total", map[string]string{"store": name, "path": p.Path, "op": op}); v != float64(want) {
					t.Errorf("%s %s %s: scraped %v bytes, the store counted %d", name, p.Path, op, v, want)
				}
			}
		}
		for op, l := range map[string]swapper.Latency{"read": st.ReadLatency, "write": st.WriteLatency} {
			m := map[string]string{"store": name, "op": op}
			if v, _ := got.Sum("zinf_nvme_latency_seconds_count", m); v != float64(l.Count) || l.Count == 0 {
				t.Errorf("%s %s latency count %v, the store counted %d", name, op, v, l.Count)
			}
			if v, _ := got.Sum("zinf_nvme_latency_seconds_bucket", map[string]string{"store": name, "op": op, "le": "+Inf"}); v != float64(l.Count) {
				t.Errorf("%s %s latency +Inf bucket %v, want %d", name, op, v, l.Count)
			}
		}
	}
	ps := rt.Metrics().Pool
	if v, _ := got.Sum("zinf_cpu_pinned_capacity_bytes", nil); v != float64(ps.CapacityBytes) {
		t.Errorf("pinned capacity %v, pool has %d", v, ps.CapacityBytes)
	}
	for p := buffers.Purpose(0); p < buffers.NumPurposes; p++ {
		if _, ok := got.Sum("zinf_cpu_pinned_bytes", map[string]string{"purpose": p.String()}); !ok {
			t.Errorf("no zinf_cpu_pinned_bytes for %s", p)
		}
	}
	if v, _ := got.Sum("zinf_optimizer_steps_total", map[string]string{"outcome": "committed"}); v != 3 {
		t.Errorf("committed optimizer steps %v, want 3", v)
	}
	if v, ok := got.Sum("zinf_param_preempted_bytes_total", nil); !ok || v != float64(rt.Metrics().Params.PreemptedBytes) {
		t.Errorf("zinf_param_preempted_bytes_total %v (present %v), the swapper counted %d", v, ok, rt.Metrics().Params.PreemptedBytes)
	}
	if v, ok := got.Sum("zinf_grad_served_bytes_total", nil); !ok || v != float64(rt.Metrics().Grads.ServedBytes) {
		t.Errorf("zinf_grad_served_bytes_total %v (present %v), the swapper counted %d", v, ok, rt.Metrics().Grads.ServedBytes)
	}
	if _, ok := got.Sum("go_goroutines", nil); !ok {
		t.Error("the registry lacks the Go collector")
	}
}

// TestOwnRegistry registers a Collector in a registry of the user's own
// (the way the package doc says), lints every metric with client_golang's
// linter, and checks that Set() empties it.
func TestOwnRegistry(t *testing.T) {
	rt, model := open(t)
	step(t, rt, model)
	c := metrics.New(rt)
	reg := prometheus.NewRegistry()
	if err := reg.Register(c); err != nil {
		t.Fatal(err)
	}
	problems, err := testutil.GatherAndLint(reg)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("lint: %s: %s", p.Metric, p.Text)
	}
	if n := testutil.CollectAndCount(c, "zinf_nvme_bytes_total"); n != 6*len(rt.ParamStore.Paths()) {
		t.Errorf("%d zinf_nvme_bytes_total series, want 3 stores x 2 ops per path", n)
	}
	c.Set()
	if n := testutil.CollectAndCount(c); n != 0 {
		t.Errorf("%d series after Set()", n)
	}
}

// TestServeBadAddress names the address it could not listen on.
func TestServeBadAddress(t *testing.T) {
	_, err := metrics.Serve("256.0.0.1:bad", metrics.NewRegistry(metrics.New()))
	if err == nil || !contains(err.Error(), "256.0.0.1:bad") {
		t.Fatalf("Serve: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	srv, err := metrics.Serve("127.0.0.1:0", prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Close(ctx); err != nil {
		t.Fatal(err)
	}
}

func contains(s, sub string) bool { return strings.Contains(s, sub) }

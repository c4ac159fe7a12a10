package policy

import (
	"errors"
	"math"
	"math/rand"
	"strings"
	"testing"
	"time"

	"github.com/zinfio/zinf/tensor"
)

func near(a, b float64) bool { return math.Abs(a-b) < 1e-9 }

func TestSimulatePass(t *testing.T) {
	order := []int{0, 1, 2, 3}
	fetch := []float64{1, 1, 1, 1}
	// Compute-bound (2 s per layer, 1 s per fetch): only the first fetch is
	// exposed once anything is prefetched.
	if r := simulatePass(order, fetch, nil, nil, nil, 2, 1); !near(r.exposed, 1) || !near(r.io, 4) {
		t.Errorf("depth 1: %+v", r)
	}
	// No prefetch: every fetch is exposed.
	if r := simulatePass(order, fetch, nil, nil, nil, 2, 0); !near(r.exposed, 4) {
		t.Errorf("depth 0: %+v", r)
	}
	// I/O-bound (0.5 s per layer): the reads set the pace, 4 - 3*0.5 exposed.
	if r := simulatePass(order, fetch, nil, nil, nil, 0.5, 3); !near(r.exposed, 2.5) {
		t.Errorf("I/O bound: %+v", r)
	}
	// Writes behind: each 1 s write is hidden behind the next layer's 1 s
	// compute, except the last one, which runs past the end of the pass.
	if r := simulatePass(order, []float64{0, 0, 0, 0}, []float64{1, 1, 1, 1}, nil, nil, 1, 1); !near(r.drain, 1) || !near(r.exposed, 0) {
		t.Errorf("writes: %+v", r)
	}
	// Gradients handed over one at a time through bufs write-behind
	// buffers (1 s writes, 0.5 s of compute a layer): a hand-off waits for
	// the write bufs hand-offs before, not for its own write (which would
	// end the pass at 6 s), so the writes follow each other on the disk
	// and the pass ends with the last one (4.5 s) however many buffers;
	// the loop waits for buffers 1.5 s with one, none with more (the
	// fetches queued behind the writes wait instead).
	writes := []float64{1, 1, 1, 1}
	for _, tc := range []struct {
		bufs int
		wait float64
	}{{1, 1.5}, {2, 0}, {0, 0}, {4, 0}} {
		r := simulatePass(order, []float64{0, 0, 0, 0}, writes, nil, nil, 0.5, 1, tc.bufs)
		if !near(r.writeWait, tc.wait) || !near(r.end, 4.5) {
			t.Errorf("%d write-behind buffers: waited %v, ended at %v; want %v, 4.5: %+v", tc.bufs, r.writeWait, r.end, tc.wait, r)
		}
	}
}

// The optimizer's checksums (verifying a layer's states once read,
// summing them before the write) delay its update, not the disk: with 1 s
// reads and 1 s of checksum each, two layers' updates end at 3 s (the
// second read runs while the first is verified), not at 4 s.
func TestSimulateOptimizerChecksumsBesideTheDisk(t *testing.T) {
	opt := &optJobs{read: []float64{1, 1}, arith: []float64{0, 0}, write: []float64{0, 0}, readCRC: []float64{1, 1}, writeCRC: []float64{0, 0}}
	r := simulatePassStep([]int{1, 0}, []float64{0, 0}, nil, nil, nil, 0, 1, 0, opt)
	if !near(r.end, 3) {
		t.Errorf("updates ended at %v, want 3: %+v", r.end, r)
	}
	// A write's checksum delays its issue, not the writes before it.
	opt = &optJobs{read: []float64{0, 0}, arith: []float64{0, 0}, write: []float64{1, 1}, readCRC: []float64{0, 0}, writeCRC: []float64{1, 1}}
	if r := simulatePassStep([]int{1, 0}, []float64{0, 0}, nil, nil, nil, 0, 1, 0, opt); !near(r.end, 3) {
		t.Errorf("writes ended at %v, want 3 (summed at 1, written 1..2, 2..3): %+v", r.end, r)
	}
}

// autoDepth's binary search relies on exposure not growing with depth:
// compare it with a linear scan on random, uneven layers.
func TestAutoDepthMatchesLinearScan(t *testing.T) {
	seed := time.Now().UnixNano()
	r := rand.New(rand.NewSource(seed))
	for i := 0; i < 300; i++ {
		L := 1 + r.Intn(30)
		m := &stepModel{layers: L, compute: r.Float64() * 3, fetch: make([]float64, L), gradWrite: make([]float64, L)}
		for l := 0; l < L; l++ {
			m.fetch[l] = r.Float64() * float64(1+r.Intn(5))
			if r.Intn(2) == 0 {
				m.gradWrite[l] = r.Float64()
			}
		}
		maxDepth := L - 1
		prev := math.Inf(1)
		for d := 0; d <= maxDepth; d++ {
			e := m.exposed(d)
			if e > prev+1e-9 {
				t.Fatalf("seed %d case %d: exposure grows from %v to %v at depth %d", seed, i, prev, e, d)
			}
			prev = e
		}
		got := m.autoDepth(maxDepth)
		want := 0
		if maxDepth >= 1 {
			best := m.exposed(maxDepth)
			for want = 1; want < maxDepth && m.exposed(want) > best+1e-9+1e-9*best; want++ {
			}
		}
		if got != want {
			t.Fatalf("seed %d case %d: autoDepth %d, linear scan %d", seed, i, got, want)
		}
	}
}

// A big layer after small ones needs a deeper window to be hidden.
func TestAutoDepthUnevenLayers(t *testing.T) {
	m := &stepModel{layers: 6, compute: 3, fetch: []float64{0.1, 0.1, 0.1, 0.1, 3.5, 0.1}, gradWrite: make([]float64, 6)}
	if d := m.autoDepth(5); d < 2 {
		t.Errorf("autoDepth = %d, want >= 2 to hide the big layer", d)
	}
}

func TestPlanInvalid(t *testing.T) {
	inv := []Tensor{{Name: "a", Bytes: 1}, {Name: "a", Bytes: 1}, {Name: "", Bytes: 1}, {Name: "n", Bytes: -1}, {Name: "k", Kind: 9}}
	_, err := Plan(Tiers{GPUBytes: -1, NVMeReadBps: math.NaN()}, inv,
		Hints{ParamDevice: "disk", OptimizerDevice: "gpu", Ratio: 2, PrefetchDepth: -1, ParamBufferCount: -1})
	if !errors.Is(err, ErrInvalid) {
		t.Fatalf("err = %v, want ErrInvalid", err)
	}
	for _, want := range []string{
		`offload_param.device "disk": want none, cpu or nvme`,
		`offload_optimizer.device "gpu"`,
		"offload_optimizer.ratio 2",
		"prefetch depth -1",
		"offload_param.buffer_count -1",
		"GPUBytes -1",
		"NVMeReadBps NaN",
		`tensor "a" is listed twice`,
		"tensor 2 has no name",
		`tensor "n": bytes -1`,
		`tensor "k": kind 9`,
	} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error does not say %q:\n%v", want, err)
		}
	}
	if _, err := Plan(Tiers{}, []Tensor{{Name: "x", Layer: 3}}, Hints{Layers: 2}); !errors.Is(err, ErrInvalid) {
		t.Errorf("layer beyond Hints.Layers: %v", err)
	}
}

func TestPlanCapacityError(t *testing.T) {
	inv := []Tensor{{Name: "w", Bytes: 1000, Kind: Param}}
	_, err := Plan(Tiers{GPUBytes: 999}, inv, Hints{})
	var ce *CapacityError
	if !errors.As(err, &ce) || !errors.Is(err, ErrNoFit) || ce.Tier != tensor.TierGPU || ce.NeedBytes != 1000 || ce.HaveBytes != 999 {
		t.Fatalf("err = %v", err)
	}
	if !strings.Contains(err.Error(), "1000 bytes") || !strings.Contains(err.Error(), `offload_param.device to "cpu" or "nvme"`) {
		t.Errorf("message: %v", err)
	}
	// The same on NVMe fits a GPU that holds two layers of working set.
	p, err := Plan(Tiers{GPUBytes: 2000, CPUBytes: 4096}, inv, Hints{ParamDevice: "nvme"})
	if err != nil || p.Tier["w"] != tensor.TierNVMe || p.ParamBufferCount != 1 || p.PrefetchDepth != 0 {
		t.Fatalf("p = %+v, err = %v", p, err)
	}
}

func TestPlanEmpty(t *testing.T) {
	p, err := Plan(Tiers{}, nil, Hints{ComputeSecondsPerLayer: 1})
	if err != nil || len(p.Tier) != 0 || p.Predicted.Total != 0 {
		t.Fatalf("p = %+v, err = %v", p, err)
	}
	var b strings.Builder
	if err := p.WriteTable(&b); err != nil {
		t.Fatal(err)
	}
}

func TestFormat(t *testing.T) {
	for n, want := range map[int64]string{0: "0 B", 1023: "1023 B", 1024: "1.0 KiB", 1536 << 20: "1.5 GiB", -2048: "-2.0 KiB"} {
		if got := FormatBytes(n); got != want {
			t.Errorf("FormatBytes(%d) = %q, want %q", n, got, want)
		}
	}
	for d, want := range map[time.Duration]string{0: "0", 850 * time.Microsecond: "850 µs", 12300 * time.Microsecond: "12.3 ms", 1250 * time.Millisecond: "1.25 s"} {
		if got := FormatDuration(d); got != want {
			t.Errorf("FormatDuration(%v) = %q, want %q", d, got, want)
		}
	}
}

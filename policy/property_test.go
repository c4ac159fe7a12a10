package policy

import (
	"errors"
	"fmt"
	"math/rand"
	"testing"
	"time"

	"github.com/zinfio/zinf/internal/test/testenv"
	"github.com/zinfio/zinf/tensor"
)

// checkInvariants verifies what every placement promises, whatever its
// inputs.
func checkInvariants(t *testing.T, tiers Tiers, inv []Tensor, h Hints, p *Placement) {
	t.Helper()
	if len(p.Tier) != len(inv) {
		t.Errorf("%d tensors placed, inventory has %d", len(p.Tier), len(inv))
	}
	var sum, perTier int64
	var kindSum int64
	for _, x := range inv {
		tier, ok := p.Tier[x.Name]
		if !ok {
			t.Errorf("tensor %q not placed", x.Name)
			continue
		}
		sum += x.Bytes
		if p.SizeOf(x.Name) != x.Bytes {
			t.Errorf("SizeOf(%q) = %d, want %d", x.Name, p.SizeOf(x.Name), x.Bytes)
		}
		if x.Kind == Param {
			want, _ := parseDevice("", h.ParamDevice)
			if tier != want && !(want == tensor.TierNVMe && tier == tensor.TierCPU) {
				t.Errorf("param %q on %s, hints say %q", x.Name, tier, h.ParamDevice)
			}
		} else {
			dev, _ := parseDevice("", h.OptimizerDevice)
			if tier != dev && tier != tensor.TierGPU {
				t.Errorf("%s %q on %s, hints say %q", x.Kind, x.Name, tier, h.OptimizerDevice)
			}
		}
	}
	for _, b := range p.BytesPerTier {
		perTier += b
	}
	for _, m := range p.PerKind {
		for _, u := range m {
			kindSum += u.Bytes
		}
	}
	if perTier != sum || kindSum != sum {
		t.Errorf("bytes: per tier %d, per kind %d, inventory %d", perTier, kindSum, sum)
	}
	if got := p.BytesPerTier[tensor.TierGPU] + p.GPUWorkingBytes; got > tiers.GPUBytes {
		t.Errorf("GPU use %d > capacity %d", got, tiers.GPUBytes)
	}
	pinned := p.BytesPerTier[tensor.TierCPU] + int64(p.ParamBufferCount)*p.ParamBufferBytes +
		int64(p.OptimizerBufferCount)*p.OptimizerBufferBytes
	if pinned != p.PinnedBytes {
		t.Errorf("PinnedBytes %d, parts sum to %d", p.PinnedBytes, pinned)
	}
	if pinned > tiers.CPUBytes {
		t.Errorf("pinned use %d > budget %d", pinned, tiers.CPUBytes)
	}
	if p.ParamCacheBytes > 0 && p.ParamCacheBytes > h.MaxInCPUBytes {
		t.Errorf("cache %d > max_in_cpu %d", p.ParamCacheBytes, h.MaxInCPUBytes)
	}
	// Buffers: one per NVMe parameter of a layer, each holding the largest.
	perLayer := map[int]int{}
	most := 0
	var largest int64
	for _, x := range inv {
		if x.Kind == Param && p.Tier[x.Name] == tensor.TierNVMe {
			perLayer[x.Layer]++
			most = max(most, perLayer[x.Layer])
			largest = max(largest, x.Bytes)
		}
	}
	if most > 0 {
		if p.ParamBufferCount < (p.PrefetchDepth+1)*most {
			t.Errorf("%d param buffers for depth %d and %d params per layer", p.ParamBufferCount, p.PrefetchDepth, most)
		}
		if p.ParamBufferBytes < largest {
			t.Errorf("param buffer %d < largest NVMe param %d", p.ParamBufferBytes, largest)
		}
	} else if p.ParamBufferCount != 0 {
		t.Errorf("%d param buffers with no parameter on NVMe", p.ParamBufferCount)
	}
	if p.PrefetchDepth < 0 || (p.Layers > 0 && p.PrefetchDepth >= max(p.Layers, 1)) {
		t.Errorf("prefetch depth %d with %d layers", p.PrefetchDepth, p.Layers)
	}
	pr := p.Predicted
	if pr.ExposedParamIO > pr.ParamIO+time.Microsecond || pr.ExposedGradIO > pr.GradIO+time.Microsecond {
		t.Errorf("exposed I/O exceeds I/O: %+v", pr)
	}
	if pr.ExposedOptimizer > pr.OptimizerIO || (!pr.Overlapped && pr.ExposedOptimizer != pr.OptimizerIO) {
		t.Errorf("exposed optimizer step %v of %v (overlapped %v)", pr.ExposedOptimizer, pr.OptimizerIO, pr.Overlapped)
	}
	if pr.Total != pr.Compute+pr.ExposedParamIO+pr.ExposedGradIO+pr.ExposedOptimizer {
		t.Errorf("total %v is not the sum of its parts: %+v", pr.Total, pr)
	}
	var phases time.Duration
	for _, ph := range pr.Phases {
		phases += ph.Total
	}
	if phases != pr.Total {
		t.Errorf("phases sum to %v, total %v", phases, pr.Total)
	}
}

var devices = []string{"", "none", "cpu", "nvme"}

func randomInputs(r *rand.Rand) (Tiers, []Tensor, Hints) {
	var inv []Tensor
	if r.Intn(3) > 0 {
		spec := ModelSpec{Layers: 1 + r.Intn(12), Width: 1 + r.Intn(300), DType: tensor.DType(r.Intn(3)), Batch: 1, World: 1 + r.Intn(4)}
		inv = spec.Inventory(0, spec.World)
	} else {
		n := r.Intn(40)
		layers := 1 + r.Intn(6)
		for i := 0; i < n; i++ {
			inv = append(inv, Tensor{
				Name:  fmt.Sprintf("t%d", i),
				Bytes: int64(r.Intn(1 << 16)),
				Kind:  Kind(r.Intn(int(numKinds))),
				Layer: r.Intn(layers),
				Order: r.Intn(100),
			})
		}
	}
	var total int64
	for _, x := range inv {
		total += x.Bytes
	}
	scale := func() int64 { return int64(r.Float64() * 1.5 * float64(total+1)) }
	t := Tiers{
		GPUBytes:     scale(),
		CPUBytes:     scale(),
		NVMeReadBps:  float64(r.Intn(3)) * 1e6 * float64(1+r.Intn(100)),
		NVMeWriteBps: float64(r.Intn(3)) * 1e6 * float64(1+r.Intn(100)),
		PCIeBps:      float64(r.Intn(2)) * 1e7 * float64(1+r.Intn(100)),
		NVMePaths:    r.Intn(4),
	}
	h := Hints{
		ParamDevice:            devices[r.Intn(len(devices))],
		OptimizerDevice:        devices[r.Intn(len(devices))],
		ComputeSecondsPerLayer: float64(r.Intn(3)) * 1e-4 * float64(r.Intn(100)),
	}
	if r.Intn(3) == 0 {
		h.MaxInCPUBytes = scale() / 4
	}
	if r.Intn(3) == 0 {
		h.ParamBufferCount = int64(r.Intn(8))
	}
	if r.Intn(3) == 0 {
		h.ParamBufferBytes = int64(r.Intn(1 << 16))
	}
	if r.Intn(3) == 0 {
		h.OptimizerBufferCount = r.Intn(10)
	}
	if r.Intn(3) == 0 {
		h.Ratio = r.Float64()
	}
	if r.Intn(3) == 0 {
		h.PrefetchDepth = r.Intn(20)
	}
	return t, inv, h
}

// TestPlanProperties plans random inputs: a placement never exceeds a
// tier's capacity and places every tensor exactly once; a failure is a
// capacity error.
func TestPlanProperties(t *testing.T) {
	seed := time.Now().UnixNano()
	t.Logf("seed %d", seed)
	r := rand.New(rand.NewSource(seed))
	n := testenv.Scale(2000, 20000)
	if testing.Short() {
		n = 300
	}
	fits := 0
	for i := 0; i < n; i++ {
		tiers, inv, h := randomInputs(r)
		p, err := Plan(tiers, inv, h)
		if err != nil {
			var ce *CapacityError
			if !errors.As(err, &ce) || !errors.Is(err, ErrNoFit) || ce.NeedBytes <= ce.HaveBytes {
				t.Fatalf("case %d (seed %d): unexpected error %v\ntiers %+v\nhints %+v", i, seed, err, tiers, h)
			}
			continue
		}
		fits++
		checkInvariants(t, tiers, inv, h, p)
		if t.Failed() {
			t.Fatalf("case %d (seed %d): tiers %+v hints %+v", i, seed, tiers, h)
		}
		if err := p.WriteTable(discard{}); err != nil {
			t.Fatal(err)
		}
	}
	if fits == 0 {
		t.Fatal("no random case fitted")
	}
}

type discard struct{}

func (discard) Write(b []byte) (int, error) { return len(b), nil }

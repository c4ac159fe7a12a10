package infer

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"strings"
	"testing"

	"github.com/zinfio/zinf/config"
	"github.com/zinfio/zinf/examples/train"
	"github.com/zinfio/zinf/swapper"
)

var quiet = slog.New(slog.DiscardHandler)

// testConfig is the embedded default with swap files in a temp dir, no
// max_in_cpu cache (so every batch streams every layer from NVMe) and a
// small pinned pool.
func testConfig(t *testing.T, mutate func(c *config.Config)) *config.Config {
	t.Helper()
	c := config.Default()
	c.SetScratchDir(t.TempDir())
	c.ZeroOptimization.OffloadParam.MaxInCPU = 0
	c.Zinf.Tiers.CPUPinnedBytes = 16 << 20
	if mutate != nil {
		mutate(c)
	}
	if err := c.Validate(); err != nil {
		t.Fatalf("test config: %v", err)
	}
	return c
}

// reference runs the same batches with every weight in memory, rounded to
// dtype the way the streamed weights are stored.
func reference(spec train.Spec, batches int) [][]float32 {
	W, B, L := spec.Width, spec.Batch, spec.Layers
	a, next, z := make([]float32, B*W), make([]float32, B*W), make([]float32, B*W)
	var out [][]float32
	for bi := 0; bi < batches; bi++ {
		x, _ := spec.Data(0, bi, 0)
		copy(a, x)
		for l := 0; l < L; l++ {
			w, b := spec.InitMaster(train.WeightName(l)), spec.InitMaster(train.BiasName(l))
			spec.Quantize(w)
			spec.Quantize(b)
			train.Forward(a, w, b, z, next, B, W, l == L-1)
			a, next = next, a
		}
		out = append(out, append([]float32(nil), a...))
	}
	return out
}

// firstDiff returns the first (batch, index) where a and b differ bit for
// bit, or "" when they are equal.
func firstDiff(a, b [][]float32) (string, bool) {
	if len(a) != len(b) {
		return "batch counts differ", true
	}
	for bi := range a {
		if len(a[bi]) != len(b[bi]) {
			return "batch sizes differ", true
		}
		for i := range a[bi] {
			if math.Float32bits(a[bi][i]) != math.Float32bits(b[bi][i]) {
				return fmt.Sprintf("batch %d element %d (%v vs %v)", bi, i, a[bi][i], b[bi][i]), true
			}
		}
	}
	return "", false
}

// TestStreamedEqualsInMemory streams the weights from NVMe layer by layer
// and checks the outputs equal in-memory inference bit for bit, in fp32,
// bf16 and fp16, and that the bytes really came from NVMe.
func TestStreamedEqualsInMemory(t *testing.T) {
	spec := train.Spec{Layers: 3, Width: 48, Batch: 4, Seed: 7}
	const batches = 3
	for _, tc := range []struct {
		name   string
		dtype  swapper.DType
		mutate func(c *config.Config)
	}{
		{"fp32", swapper.Float32, nil},
		{"bf16", swapper.BFloat16, func(c *config.Config) { c.BF16 = true }},
		{"fp16", swapper.Float16, func(c *config.Config) { c.FP16 = true }},
		{"prefetch-all", swapper.Float32, nil},
		{"backend-posix", swapper.Float32, func(c *config.Config) { c.Zinf.Backend = config.BackendPosix }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := Options{Config: testConfig(t, tc.mutate), Spec: spec, Batches: batches, Verify: true, Logger: quiet}
			if tc.name == "prefetch-all" {
				o.Prefetch = spec.Layers
			}
			res, err := Run(context.Background(), o)
			if err != nil {
				t.Fatal(err)
			}
			if res.OutputEqual == nil || !*res.OutputEqual {
				t.Fatalf("Verify says the streamed outputs differ from in-memory inference: %+v", res)
			}
			s := spec
			s.DType = tc.dtype
			if where, differ := firstDiff(res.Outputs, reference(s, batches)); differ {
				t.Fatalf("streamed outputs differ from the in-memory reference at %s", where)
			}
			// Every batch streams every layer: at least the parameters'
			// bytes per batch came off NVMe.
			if want := int64(batches) * spec.ParamCount() * int64(tc.dtype.Size()); res.BytesRead < want {
				t.Fatalf("read %d bytes from NVMe, want at least %d (%d batches x %d params x %d bytes)",
					res.BytesRead, want, batches, spec.ParamCount(), tc.dtype.Size())
			}
			if res.Batches != batches || res.Params != spec.ParamCount() {
				t.Fatalf("result %+v: want %d batches of %d params", res, batches, spec.ParamCount())
			}
		})
	}
}

// TestReferenceIsSensitive guards the comparison itself: the reference in
// another dtype, or with another seed, must not pass as equal.
func TestReferenceIsSensitive(t *testing.T) {
	spec := train.Spec{Layers: 2, Width: 16, Batch: 2, Seed: 3}
	res, err := Run(context.Background(), Options{Config: testConfig(t, nil), Spec: spec, Batches: 2, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	if res.OutputEqual != nil {
		t.Fatalf("OutputEqual set without Verify: %v", *res.OutputEqual)
	}
	if _, differ := firstDiff(res.Outputs, reference(spec, 2)); differ {
		t.Fatal("fp32 run differs from its reference")
	}
	bf := spec
	bf.DType = swapper.BFloat16
	if _, differ := firstDiff(res.Outputs, reference(bf, 2)); !differ {
		t.Fatal("fp32 outputs equal a bf16 reference: the comparison cannot see rounding")
	}
	other := spec
	other.Seed = 4
	if _, differ := firstDiff(res.Outputs, reference(other, 2)); !differ {
		t.Fatal("outputs equal another seed's reference")
	}
}

// TestParamsInCPUMemory: with offload_param on the CPU nothing is read from
// NVMe and the outputs still match.
func TestParamsInCPUMemory(t *testing.T) {
	spec := train.Spec{Layers: 2, Width: 32, Batch: 2, Seed: 1}
	cfg := testConfig(t, func(c *config.Config) { c.ZeroOptimization.OffloadParam.Device = config.OffloadCPU })
	res, err := Run(context.Background(), Options{Config: cfg, Spec: spec, Batches: 2, Verify: true, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	if res.OutputEqual == nil || !*res.OutputEqual || res.BytesRead != 0 {
		t.Fatalf("params on CPU: %+v", res)
	}
}

func TestBadOptions(t *testing.T) {
	spec := train.Spec{Layers: 2, Width: 8, Batch: 2, Seed: 1}
	for _, tc := range []struct {
		name string
		o    Options
		want string
	}{
		{"no config", Options{Spec: spec}, "no config"},
		{"negative batches", Options{Config: testConfig(t, nil), Spec: spec, Batches: -1}, "batches -1"},
		{"negative prefetch", Options{Config: testConfig(t, nil), Spec: spec, Prefetch: -2}, "prefetch -2"},
		{"no layers", Options{Config: testConfig(t, nil), Spec: train.Spec{Width: 8, Batch: 2}}, "layers 0"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.o.Logger = quiet
			_, err := Run(context.Background(), tc.o)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want one mentioning %q", err, tc.want)
			}
		})
	}
}

func TestCanceled(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := Run(ctx, Options{Config: testConfig(t, nil), Spec: train.Spec{Layers: 2, Width: 8, Batch: 2}, Logger: quiet})
	if err == nil {
		t.Fatal("a canceled run succeeded")
	}
}

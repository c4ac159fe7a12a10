package zinf_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/zinfio/zinf"
	"github.com/zinfio/zinf/plan"
	"github.com/zinfio/zinf/tensor"
)

// TestSubGroupReadsExact: with checksums on and a sub_group_size far
// below the 1 MiB stripe (65536 elements: 256 KiB of gradient), what the
// stores ask of the device (Metrics.DeviceBytesRead) is what the step
// reads (Metrics.BytesRead) to within the alignment of each tensor's last
// bytes. With one checksum per stripe, the optimizer's read of each
// sub-group's gradient covered the whole 1 MiB stripe: the device read
// 1.5x the logical bytes (bench-llm-big, zinf train at this sub-group).
func TestSubGroupReadsExact(t *testing.T) {
	c, _ := testConfig(t)
	c.ZeroOptimization.SubGroupSize = 65_536
	c.Zinf.Tiers.CPUPinnedBytes = 32 << 20
	if !c.Zinf.Checksums {
		t.Fatal("the default config has checksums off")
	}
	// Tensors of odd sizes: several sub-groups each, the last one short.
	const n0, n1 = 300_001, 2*65_536 + 7
	m := zinf.LayeredModel([]tensor.Desc{{Name: "w0", Shape: []int{n0}}}, []tensor.Desc{{Name: "w1", Shape: []int{n1}}})
	rt, err := zinf.Open(c, m, zinf.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer rt.Close()
	ctx, watch := watchdog(t, time.Minute)
	watch(rt)
	g := map[string][]float32{"w0": make([]float32, n0), "w1": make([]float32, n1)}
	for name, v := range g {
		for i := range v {
			v[i] = float32(i%97) / 97
		}
		if err := rt.Init(ctx, name, make([]float32, len(v))); err != nil {
			t.Fatal(err)
		}
	}
	m0 := rt.Metrics()
	for range 3 {
		stepOnce(t, ctx, rt, g, true)
	}
	m1 := rt.Metrics()
	logical, device := m1.BytesRead-m0.BytesRead, m1.DeviceBytesRead-m0.DeviceBytesRead
	if logical == 0 {
		t.Fatal("the steps read nothing from NVMe")
	}
	// Each read may round its last bytes up to the alignment; far less
	// than a stripe.
	if r := float64(device) / float64(logical); r > 1.02 {
		t.Fatalf("the stores asked the device for %d bytes for %d read (%.2fx); want the same to within 2%%", device, logical, r)
	}
	t.Logf("logical %d bytes, device %d (%.4fx)", logical, device, float64(device)/float64(logical))
}

// TestSubGroupChecksumBytes: the gradient and optimizer stores' checksum
// unit divides every sub-group's gradient range.
func TestSubGroupChecksumBytes(t *testing.T) {
	for _, tc := range []struct {
		sg, piece, want int64
	}{
		{65_536, 0, 256 << 10},
		{65_536, -1, 256 << 10},
		{0, 0, 4 << 20},             // the default sub-group, capped at the default 4 MiB piece
		{1 << 20, 1 << 20, 1 << 20}, // capped at a 1 MiB piece: 262144 elements
		{100_000, 0, 128},           // 400000 bytes: the store rounds 128 up to its alignment
		{3 * 65_536, 0, 256 << 10},  // 768 KiB sub-groups: 256 KiB divides them
		{1 << 30, -1, 4 << 30},      // no pieces: the whole sub-group
	} {
		t.Run(fmt.Sprint(tc.sg, "/", tc.piece), func(t *testing.T) {
			got := plan.SubGroupChecksumBytes(tc.sg, tc.piece)
			if got != tc.want {
				t.Fatalf("SubGroupChecksumBytes(%d, %d) = %d, want %d", tc.sg, tc.piece, got, tc.want)
			}
		})
	}
}

package plan_test

import (
	"context"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/zinfio/zinf"
	"github.com/zinfio/zinf/config"
	"github.com/zinfio/zinf/plan"
	"github.com/zinfio/zinf/tensor"
)

var model = plan.LayeredModel(
	[]tensor.Desc{{Name: "emb", Shape: []int{211, 307}}},
	[]tensor.Desc{{Name: "l1.w", Shape: []int{307, 307}}, {Name: "l1.b", Shape: []int{307}}},
	[]tensor.Desc{{Name: "head", Shape: []int{307, 101}}},
)

func nvmeConfig(dir string) *config.Config {
	c := config.Default()
	c.SetScratchDir(dir)
	c.Zinf.Tiers.CPUPinnedBytes = 64 << 20
	c.ZeroOptimization.SubGroupSize = 40_009
	c.Zinf.Bandwidth.Probe = false
	return c
}

// measured is what a plan takes from the machine, made without touching
// it: the given bandwidth and the stores' geometry from the settings (as
// zinf.PlanModel and zinf.Open size them).
func measured(t *testing.T, in *plan.Inputs, bw plan.Bandwidth) plan.Measured {
	t.Helper()
	return plan.Measured{Bandwidth: bw, Stores: plan.GeometryOf(&in.Settings)}
}

// TestMakeIsPureAndIsPlanModel: plan.Make is a function of its inputs —
// twice the same inputs give the same plan, and it creates nothing in the
// NVMe paths — and it is what zinf.PlanModel returns for them: placement,
// reservations, disk and bandwidth.
func TestMakeIsPureAndIsPlanModel(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "not-yet")
	cfg := nvmeConfig(dir)
	in, err := plan.Check(cfg, model, plan.Given{})
	if err != nil {
		t.Fatal(err)
	}
	if in.Rank != 0 || in.World != 1 || len(in.Model.Layers) != 3 || in.Settings.ParamStore.Paths == nil {
		t.Fatalf("checked inputs: rank %d world %d layers %d param store paths %v", in.Rank, in.World, len(in.Model.Layers), in.Settings.ParamStore.Paths)
	}
	bw := plan.StaticBandwidth(cfg)
	o := plan.Options{ComputePerLayer: 2 * time.Millisecond}
	p1, err := plan.Make(in, measured(t, in, bw), o)
	if err != nil {
		t.Fatal(err)
	}
	p2, err := plan.Make(in, measured(t, in, bw), o)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(p1.Reservations, p2.Reservations) || !reflect.DeepEqual(p1.Disk, p2.Disk) ||
		!reflect.DeepEqual(p1.Placement.Tier, p2.Placement.Tier) || !reflect.DeepEqual(p1.Components.Pool, p2.Components.Pool) {
		t.Errorf("the same inputs gave two plans:\n%+v\n%+v", p1.Reservations, p2.Reservations)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("planning touched the NVMe path %s: %v", dir, err)
	}
	if p1.DiskBytes() == 0 || p1.Reservations.MinPoolBytes == 0 || len(p1.Components.NVMeLayers) != 3 {
		t.Errorf("plan: disk %d, minimum pool %d, nvme layers %v", p1.DiskBytes(), p1.Reservations.MinPoolBytes, p1.Components.NVMeLayers)
	}
	if p1.Components.Pool.CapacityBytes != p1.Reservations.PoolBytes || p1.Components.Pool.MinBufferBytes != int(p1.Reservations.GranuleBytes) {
		t.Errorf("the pool's options %+v do not follow the reservations %+v", p1.Components.Pool, p1.Reservations)
	}

	zp, err := zinf.PlanModel(context.Background(), cfg, model, zinf.Options{Bandwidth: &bw, ComputePerLayer: 2 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(zp.Reservations, p1.Reservations) || !reflect.DeepEqual(zp.Disk, p1.Disk) ||
		!reflect.DeepEqual(zp.Placement.Tier, p1.Placement.Tier) || !reflect.DeepEqual(zp.Bandwidth, p1.Bandwidth) {
		t.Errorf("zinf.PlanModel %+v\nplan.Make %+v", zp.Reservations, p1.Reservations)
	}
}

// TestCheckRefuses: plan.Check refuses a nil config, a bad model and a
// rank outside the world, naming what is wrong.
func TestCheckRefuses(t *testing.T) {
	cfg := nvmeConfig(t.TempDir())
	for name, c := range map[string]struct {
		cfg  *config.Config
		m    plan.Model
		g    plan.Given
		want string
	}{
		"nil config":   {nil, model, plan.Given{}, "nil config"},
		"no tensors":   {cfg, plan.Model{}, plan.Given{}, "no tensors"},
		"rank outside": {cfg, model, plan.Given{Rank: 2, WorldSize: 2}, "rank 2 is outside world size 2"},
	} {
		_, err := plan.Check(c.cfg, c.m, c.g)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v; want an error saying %q", name, err, c.want)
		}
	}
}

// TestPlanSaysSubGroupCapped: a sub_group_size the user chose that the
// default piece lowers is named in the plan's notes with the key that
// keeps it; with pieces large enough, or DeepSpeed's default sub-group,
// there is no such note.
func TestPlanSaysSubGroupCapped(t *testing.T) {
	big := plan.LayeredModel([]tensor.Desc{{Name: "w", Shape: []int{2048, 2048}}}, []tensor.Desc{{Name: "v", Shape: []int{2048, 2048}}})
	notes := func(sub int64, piece config.Size) string {
		cfg := nvmeConfig(t.TempDir())
		cfg.Zinf.Tiers.CPUPinnedBytes = 1 << 30
		cfg.ZeroOptimization.SubGroupSize = sub
		cfg.Zinf.PieceBytes = piece
		p, err := zinf.PlanModel(context.Background(), cfg, big, zinf.Options{NoBandwidthProbe: true})
		if err != nil {
			t.Fatal(err)
		}
		return strings.Join(p.Placement.Notes, "\n")
	}
	const key = "zero_optimization.sub_group_size 4194304 is capped at 1048576 elements"
	if n := notes(2048*2048, 0); !strings.Contains(n, key) || !strings.Contains(n, "zinf.piece_bytes to 16MiB or more") {
		t.Fatalf("a 4M-element sub-group under the 4 MiB default piece: notes\n%s", n)
	}
	for _, c := range []struct {
		sub   int64
		piece config.Size
	}{{2048 * 2048, 16 << 20}, {1e9, 0}, {1 << 20, 0}} {
		if n := notes(c.sub, c.piece); strings.Contains(n, "sub_group_size") {
			t.Fatalf("sub_group_size %d, piece_bytes %v: notes\n%s", c.sub, c.piece, n)
		}
	}
}

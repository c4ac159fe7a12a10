package zinf_test

import (
	"context"
	"errors"
	"io/fs"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/zinfio/zinf"
	"github.com/zinfio/zinf/aio"
	"github.com/zinfio/zinf/config"
	"github.com/zinfio/zinf/swapper"
	"github.com/zinfio/zinf/tensor"
)

var quietLog = slog.New(slog.DiscardHandler)

// mountTmpfs mounts a tmpfs of size bytes (rounded up to pages) on a
// fresh directory for the test, or skips the test where mounting is not
// allowed.
func mountTmpfs(t *testing.T, size int64) string {
	t.Helper()
	mnt := t.TempDir()
	if err := syscall.Mount("tmpfs", mnt, "tmpfs", 0, "size="+strconv.FormatInt(size, 10)); err != nil {
		t.Skipf("cannot mount a %d-byte tmpfs here (needs root or CAP_SYS_ADMIN): %v", size, err)
	}
	t.Cleanup(func() {
		if err := syscall.Unmount(mnt, 0); err != nil {
			t.Errorf("unmount %s: %v", mnt, err)
		}
	})
	return mnt
}

// diskUsed is what the files under dir take on disk.
func diskUsed(t *testing.T, dir string) int64 {
	t.Helper()
	var total int64
	err := filepath.WalkDir(dir, func(_ string, e fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		info, err := e.Info()
		if err != nil {
			return err
		}
		total += info.Sys().(*syscall.Stat_t).Blocks * 512
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return total
}

// diskModel has prime-sized tensors, so padding and sub-groups matter.
var diskModel = zinf.LayeredModel(
	[]tensor.Desc{{Name: "emb", Shape: []int{211, 307}}},
	[]tensor.Desc{{Name: "l1.w", Shape: []int{307, 307}}, {Name: "l1.b", Shape: []int{307}}},
	[]tensor.Desc{{Name: "l2.w", Shape: []int{307, 307}}, {Name: "l2.b", Shape: []int{307}}},
	[]tensor.Desc{{Name: "head", Shape: []int{307, 101}}},
)

func diskConfig(dir string) *config.Config {
	c := config.Default()
	c.SetScratchDir(dir)
	c.Zinf.Tiers.CPUPinnedBytes = 64 << 20
	c.ZeroOptimization.OffloadParam.MaxInCPU = 0
	c.ZeroOptimization.SubGroupSize = 40_009
	c.Zinf.Bandwidth.Probe = false
	return c
}

// TestFreeSpaceCheckedAtOpen: `zinf plan`'s disk figure (PlanModel) counts
// the copies copy-on-write keeps; a filesystem with less free space than
// that is refused at Open, naming the path, the need and the free bytes,
// before anything is written; on a filesystem of exactly that size the
// model trains several steps (with micro-steps and the step overlapping
// backward), bit for bit as in memory, and the swap files stay within the
// figure.
func TestFreeSpaceCheckedAtOpen(t *testing.T) {
	plan, err := zinf.PlanModel(context.Background(), diskConfig("/nonexistent/zinf-plan"), diskModel, zinf.Options{NoBandwidthProbe: true})
	if err != nil {
		t.Fatal(err)
	}
	need := plan.DiskBytes()
	var once int64 // the tensors, each stored once
	for _, d := range diskModel.Tensors {
		n, _ := d.Numel()
		once += n * (4 + 4 + 12) // fp32 param, gradient, optimizer record
	}
	if need < 2*once {
		t.Fatalf("the plan counts %d bytes of disk for %d bytes of tensors: copy-on-write keeps two copies", need, once)
	}
	t.Logf("tensors once: %d bytes; plan's disk need: %d bytes", once, need)

	t.Run("too small", func(t *testing.T) {
		mnt := mountTmpfs(t, need/2)
		_, err := zinf.Open(diskConfig(mnt), diskModel, zinf.Options{Logger: quietLog, NoBandwidthProbe: true})
		var se *swapper.SpaceError
		if !errors.As(err, &se) || !errors.Is(err, aio.ErrNoSpace) {
			t.Fatalf("Open on a filesystem of half the need: %v", err)
		}
		for _, want := range []string{mnt, "free", "need", strconv.FormatInt(se.FreeBytes, 10), strconv.FormatInt(se.NeedBytes, 10), "zinf plan"} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("the error does not say %q: %v", want, err)
			}
		}
		if se.Path != mnt || se.NeedBytes <= se.FreeBytes || se.FreeBytes > need/2 {
			t.Errorf("SpaceError %+v", se)
		}
		if ents, _ := os.ReadDir(mnt); len(ents) != 0 {
			t.Errorf("a refused Open left %d entries in %s", len(ents), mnt)
		}
	})

	t.Run("exactly enough", func(t *testing.T) {
		mnt := mountTmpfs(t, need)
		ctx, watch := watchdog(t, 2*time.Minute)
		cfg := diskConfig(mnt)
		cfg.GradientAccumulationSteps = 2
		rt, err := zinf.Open(cfg, diskModel, zinf.Options{Logger: quietLog, NoBandwidthProbe: true})
		if err != nil {
			t.Fatalf("Open on a filesystem of the plan's size: %v", err)
		}
		defer rt.Close()
		watch(rt)
		if got := rt.DiskNeeds(); len(got) != 1 || got[0].Path != mnt || got[0].Bytes != need {
			t.Errorf("Runtime.DiskNeeds() = %+v, want the plan's %d on %s", got, need, mnt)
		}
		tr := &trainRun{t: t, rng: rand.New(rand.NewPCG(1, 2)), model: diskModel, cfg: cfg, rts: []*zinf.Runtime{rt}, micro: 2, steps: 4}
		tr.run(ctx)
		if used := diskUsed(t, mnt); used > need {
			t.Errorf("the swap files take %d bytes, more than the plan's %d", used, need)
		} else {
			t.Logf("swap files after training: %d bytes of the plan's %d", used, need)
		}
	})
}

// TestFreeSpaceInference: an inference runtime needs one copy of its NVMe
// parameters on disk (Init writes each once, nothing is updated), not the
// two copy-on-write keeps for training: a model twice the free space
// after its own file was refused before it could be read in place.
func TestFreeSpaceInference(t *testing.T) {
	var once int64 // the fp32 parameters, each stored once
	for _, d := range diskModel.Tensors {
		n, _ := d.Numel()
		once += n * 4
	}
	rt, err := zinf.Open(diskConfig(t.TempDir()), diskModel, zinf.Options{Logger: quietLog, NoBandwidthProbe: true, Inference: true})
	if err != nil {
		t.Fatal(err)
	}
	defer rt.Close()
	var need int64
	for _, n := range rt.DiskNeeds() {
		need += n.Bytes
	}
	if need < once || need >= 2*once {
		t.Fatalf("an inference runtime needs %d bytes of disk for %d bytes of parameters (want one copy, with padding and overheads)", need, once)
	}
}

// TestFreeSpaceInPlace: an inference runtime whose parameters are all read
// where the caller's file holds them (Options.InPlace) counts no disk for
// them: a model as large as the free space after its own file opens, and
// Options.InPlace without Options.Inference is refused.
func TestFreeSpaceInPlace(t *testing.T) {
	var once int64 // the fp32 parameters, each stored once
	for _, d := range diskModel.Tensors {
		n, _ := d.Numel()
		once += n * 4
	}
	needs := func(inPlace bool) int64 {
		rt, err := zinf.Open(diskConfig(t.TempDir()), diskModel, zinf.Options{Logger: quietLog, NoBandwidthProbe: true, Inference: true, InPlace: inPlace})
		if err != nil {
			t.Fatal(err)
		}
		defer rt.Close()
		var need int64
		for _, n := range rt.DiskNeeds() {
			need += n.Bytes
		}
		return need
	}
	// The other stores' own files remain; the parameters' copy goes.
	written, inPlace := needs(false), needs(true)
	if written-inPlace < once {
		t.Errorf("disk needed: %d bytes in place, %d written, for %d bytes of parameters (want at least their size less)", inPlace, written, once)
	}
	if _, err := zinf.Open(diskConfig(t.TempDir()), diskModel, zinf.Options{Logger: quietLog, NoBandwidthProbe: true, InPlace: true}); err == nil || !strings.Contains(err.Error(), "Options.Inference") {
		t.Errorf("InPlace on a training runtime: %v, want a refusal naming Options.Inference", err)
	}
}

// TestFreeSpaceSharedFilesystem: two NVMe paths on one filesystem need
// their sum there; the refusal names both.
func TestFreeSpaceSharedFilesystem(t *testing.T) {
	plan, err := zinf.PlanModel(context.Background(), diskConfig("/nonexistent/zinf-plan"), diskModel, zinf.Options{NoBandwidthProbe: true})
	if err != nil {
		t.Fatal(err)
	}
	mnt := mountTmpfs(t, plan.DiskBytes()*3/4)
	a, b := filepath.Join(mnt, "a"), filepath.Join(mnt, "b")
	os.Mkdir(a, 0o755)
	os.Mkdir(b, 0o755)
	cfg := diskConfig(a)
	cfg.ZeroOptimization.OffloadOptimizer.NVMePath = b
	_, err = zinf.Open(cfg, diskModel, zinf.Options{Logger: quietLog, NoBandwidthProbe: true})
	var se *swapper.SpaceError
	if !errors.As(err, &se) || len(se.Shared) != 1 || !strings.Contains(err.Error(), a) || !strings.Contains(err.Error(), b) {
		t.Fatalf("two paths on one filesystem of 3/4 the need: %v", err)
	}
	for _, p := range []string{a, b} {
		if ents, _ := os.ReadDir(p); len(ents) != 0 {
			t.Errorf("a refused Open left %d entries in %s", len(ents), p)
		}
	}
}

// TestPlanTableShowsReservations: the placement table's CPU rows are the
// pinned pool's reservations (what Open enforces), adding up to the pool,
// not the policy's own parameter and optimizer buffer counts.
func TestPlanTableShowsReservations(t *testing.T) {
	plan, err := zinf.PlanModel(context.Background(), diskConfig("/nonexistent/zinf-plan"), diskModel, zinf.Options{NoBandwidthProbe: true})
	if err != nil {
		t.Fatal(err)
	}
	r := plan.Reservations
	want := map[string]int64{"gradients: write-behind": r.GradBytes, "optimizer: step pipeline": r.OptimizerBytes}
	var sum int64
	for _, row := range plan.Placement.PinnedRows {
		sum += row.Bytes
		if w, ok := want[row.What]; ok && w != row.Bytes {
			t.Errorf("row %q: %d bytes, reservation %d", row.What, row.Bytes, w)
		}
		if strings.HasPrefix(row.What, "params") && row.Bytes != r.ParamsBytes() {
			t.Errorf("row %q: %d bytes, the parameters' region is %d", row.What, row.Bytes, r.ParamsBytes())
		}
	}
	if sum > r.PoolBytes || sum < r.MinPoolBytes {
		t.Errorf("pinned rows add up to %d bytes; minimum pool %d, pool %d", sum, r.MinPoolBytes, r.PoolBytes)
	}
	var sb strings.Builder
	if err := plan.WriteText(&sb); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(sb.String(), "optimizer buffers") || !strings.Contains(sb.String(), "optimizer: step pipeline") {
		t.Errorf("the table does not show the reservations:\n%s", sb.String())
	}
}

// TestPreallocateAtOpen: a training runtime takes the disk its plan counts
// at Open (zinf.preallocate, the default), before any step; the first
// step's staged copies then land in that space, and training does not
// grow the files. With the key false, or for an inference runtime, Open
// takes next to nothing.
func TestPreallocateAtOpen(t *testing.T) {
	open := func(t *testing.T, dir string, prealloc, inference bool) *zinf.Runtime {
		t.Helper()
		cfg := diskConfig(dir)
		cfg.Zinf.Preallocate = prealloc
		rt, err := zinf.Open(cfg, diskModel, zinf.Options{Logger: quietLog, NoBandwidthProbe: true, Inference: inference})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { rt.Close() })
		return rt
	}
	// What the stores' own files take beside their extents: a run
	// directory and a lock file per store.
	const stores = 3
	slack := int64(stores) * swapper.PathOverheadBytes

	t.Run("training", func(t *testing.T) {
		dir := t.TempDir()
		rt := open(t, dir, true, false)
		var need int64
		for _, n := range rt.DiskNeeds() {
			need += n.Bytes
		}
		var once int64 // the tensors, each stored once
		for _, d := range diskModel.Tensors {
			n, _ := d.Numel()
			once += n * (4 + 4 + 12) // fp32 param, gradient, optimizer record
		}
		// Two copies of every tensor, padded to the stores' alignment
		// (which may be finer than the plan's 4 KiB).
		taken := diskUsed(t, dir)
		if taken < 2*once || taken > need {
			t.Fatalf("after Open the swap files take %d bytes; want two copies of the tensors' %d bytes and at most the plan's %d", taken, once, need)
		}
		ctx, watch := watchdog(t, 2*time.Minute)
		watch(rt)
		tr := &trainRun{t: t, rng: rand.New(rand.NewPCG(3, 4)), model: diskModel, cfg: rt.Config, rts: []*zinf.Runtime{rt}, micro: 2, steps: 3}
		tr.run(ctx)
		if after := diskUsed(t, dir); after > taken+slack {
			t.Fatalf("training grew the swap files from %d to %d bytes", taken, after)
		}
	})
	t.Run("off", func(t *testing.T) {
		dir := t.TempDir()
		open(t, dir, false, false)
		if taken := diskUsed(t, dir); taken > slack {
			t.Fatalf("zinf.preallocate false: Open took %d bytes of disk", taken)
		}
	})
	t.Run("inference", func(t *testing.T) {
		dir := t.TempDir()
		open(t, dir, true, true)
		if taken := diskUsed(t, dir); taken > slack {
			t.Fatalf("an inference runtime took %d bytes of disk at Open", taken)
		}
	})
}

// TestKVCacheDiskCheckedAtOpen: a KV cache on NVMe writes every layer's
// entry, copy-on-write, into swap files beside the runtime's; one the
// filesystem cannot hold is refused when it is opened, naming the path,
// the bytes needed and the bytes free, and leaves nothing behind, instead
// of failing with ENOSPC in the middle of decoding. One that fits opens.
func TestKVCacheDiskCheckedAtOpen(t *testing.T) {
	mnt := mountTmpfs(t, 20<<20)
	c := config.Default()
	c.SetScratchDir(mnt)
	c.Zinf.Tiers.CPUPinnedBytes = 1 << 20
	c.Zinf.KVCache = config.KVCache{Device: config.KVCacheNVMe}
	c.Zinf.Bandwidth.Probe = false
	rt, err := zinf.Open(c, zinf.LayeredModel([]tensor.Desc{{Name: "w", Shape: []int{64}}}), zinf.Options{Inference: true, NoBandwidthProbe: true, Logger: quietLog})
	if err != nil {
		t.Fatal(err)
	}
	defer rt.Close()
	if err := rt.Init(context.Background(), "w", make([]float32, 64)); err != nil {
		t.Fatal(err)
	}
	before, _ := os.ReadDir(mnt)

	// 4 layers x 3 MiB: 12 MiB of cache, 24 MiB of swap files with
	// copy-on-write, more than the 20 MiB filesystem.
	const layers, layerBytes = 4, 3 << 20
	kv, err := rt.OpenKVCache(layers, layerBytes)
	if err == nil {
		kv.Close()
		t.Fatalf("a KV cache needing %d bytes of disk opened on a %d-byte filesystem", 2*layers*layerBytes, 20<<20)
	}
	var se *swapper.SpaceError
	if !errors.As(err, &se) || !errors.Is(err, aio.ErrNoSpace) {
		t.Fatalf("OpenKVCache on a too-small filesystem: %v, want a *swapper.SpaceError", err)
	}
	if se.Path != mnt || se.NeedBytes < 2*layers*layerBytes || se.FreeBytes >= se.NeedBytes || se.FreeBytes > 20<<20 {
		t.Errorf("SpaceError %+v", se)
	}
	for _, want := range []string{mnt, "KV cache", strconv.FormatInt(se.NeedBytes, 10), strconv.FormatInt(se.FreeBytes, 10)} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("the error does not say %q: %v", want, err)
		}
	}
	if after, _ := os.ReadDir(mnt); len(after) != len(before) {
		t.Errorf("the refused KV cache left entries in %s: %d before, %d after", mnt, len(before), len(after))
	}

	// 2 layers x 3 MiB (12 MiB of swap files) fits, and works.
	kv, err = rt.OpenKVCache(2, layerBytes)
	if err != nil {
		t.Fatalf("a KV cache that fits: %v", err)
	}
	defer kv.Close()
	for l := range 2 {
		b, err := kv.Begin(context.Background(), l)
		if err != nil {
			t.Fatal(err)
		}
		fill(b, 1, l)
		if err := kv.End(l, len(b)); err != nil {
			t.Fatal(err)
		}
	}
}

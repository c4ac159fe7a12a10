package zinf_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/zinfio/zinf"
	"github.com/zinfio/zinf/aio"
	"github.com/zinfio/zinf/config"
	"github.com/zinfio/zinf/internal/faults"
	"github.com/zinfio/zinf/swapper"
)

func testConfig(t *testing.T) (*config.Config, string) {
	dir := t.TempDir()
	c := config.Default()
	c.SetScratchDir(dir)
	c.Zinf.Tiers.CPUPinnedBytes = 8 << 20
	return c, dir
}

func TestOpenRejectsBadConfig(t *testing.T) {
	c, _ := testConfig(t)
	c.AIO.QueueDepth = 0
	c.ZeroOptimization.OffloadParam.BufferCount = 0
	_, err := zinf.Open(c, zinf.Options{})
	if err == nil || !strings.Contains(err.Error(), "aio.queue_depth") || !strings.Contains(err.Error(), "offload_param.buffer_count") {
		t.Fatalf("want both problems named, got %v", err)
	}
	c2 := config.Default() // nvme_path unset
	if _, err := zinf.Open(c2, zinf.Options{}); err == nil || !strings.Contains(err.Error(), "nvme_path") {
		t.Fatalf("missing nvme_path: %v", err)
	}
	c3, _ := testConfig(t)
	c3.ZeroOptimization.OffloadParam.NVMePath = "/nonexistent/zinf-nvme"
	if _, err := zinf.Open(c3, zinf.Options{}); err == nil || !strings.Contains(err.Error(), "does not exist") {
		t.Fatalf("absent NVMe path: %v", err)
	}
}

func TestCloseRemovesScratchAndFreesPinned(t *testing.T) {
	c, dir := testConfig(t)
	rt, err := zinf.Open(c, zinf.Options{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := rt.RegisterParam(ctx, "w", swapper.TierNVMe, make([]float32, 10000)); err != nil {
		t.Fatal(err)
	}
	if ents, _ := os.ReadDir(dir); len(ents) == 0 {
		t.Fatal("no scratch dirs created")
	}
	if err := rt.Close(); err != nil {
		t.Fatal(err)
	}
	if err := rt.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 0 {
		names := []string{}
		for _, e := range ents {
			names = append(names, e.Name())
		}
		t.Fatalf("scratch left after Close: %v", names)
	}
}

// TestStepAllOrNothing: a step that hits ENOSPC changes nothing and a retry
// after space returns gives the fault-free result.
func TestStepAllOrNothing(t *testing.T) {
	ctx := context.Background()
	run := func(inject bool) []float32 {
		c, _ := testConfig(t)
		inj := faults.New(1)
		rt, err := zinf.Open(c, zinf.Options{Faults: inj})
		if err != nil {
			t.Fatal(err)
		}
		defer rt.Close()
		w := make([]float32, 5000)
		for i := range w {
			w[i] = float32(i%7) / 7
		}
		if err := rt.RegisterParam(ctx, "w", swapper.TierNVMe, w); err != nil {
			t.Fatal(err)
		}
		g := make([]float32, len(w))
		for i := range g {
			g[i] = float32(i%5) / 10
		}
		if err := rt.Grads.Accumulate(ctx, "w", g); err != nil {
			t.Fatal(err)
		}
		if inject {
			before, _, _, _ := rt.Optimizer.ReadState(ctx, "w")
			inj.Add(faults.Rule{Kind: faults.Writes, PathContains: filepath.Join("/", "zinf-optim-"), Err: syscall.ENOSPC})
			if err := rt.Step(ctx); err == nil || !strings.Contains(err.Error(), `"w`) {
				t.Fatalf("want ENOSPC naming the tensor, got %v", err)
			} else if !errors.Is(err, aio.ErrNoSpace) {
				t.Fatalf("not ErrNoSpace: %v", err)
			}
			after, _, _, _ := rt.Optimizer.ReadState(ctx, "w")
			for i := range before {
				if before[i] != after[i] {
					t.Fatal("master changed by a failed step")
				}
			}
			inj.Clear()
		}
		if err := rt.Step(ctx); err != nil {
			t.Fatal(err)
		}
		m, _, _, err := rt.Optimizer.ReadState(ctx, "w")
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
	clean, retried := run(false), run(true)
	for i := range clean {
		if clean[i] != retried[i] {
			t.Fatalf("element %d: %v after retry, %v fault-free", i, retried[i], clean[i])
		}
	}
}

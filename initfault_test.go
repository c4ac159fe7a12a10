package zinf_test

import (
	"errors"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/zinfio/zinf"
	"github.com/zinfio/zinf/aio"
	"github.com/zinfio/zinf/internal/test/faults"
)

// TestInitAllOrNothing: an Init that fails on a full disk or an I/O error
// — writing the parameter, or the optimizer's states after the parameter
// was written — leaves nothing of the tensor in any store or in pinned
// memory (with and without the max_in_cpu cache); after space returns,
// Init again succeeds. (TestMetamorphic retries failed Inits at random
// and trains on, bit for bit.)
func TestInitAllOrNothing(t *testing.T) {
	for _, c := range []struct {
		name  string
		rule  faults.Rule
		cache bool
	}{
		{"param write ENOSPC", faults.Rule{Kind: faults.Writes, PathContains: "/zinf-param-", Err: syscall.ENOSPC}, false},
		{"optimizer write ENOSPC", faults.Rule{Kind: faults.Writes, PathContains: "/zinf-optim-", Err: syscall.ENOSPC}, false},
		{"optimizer second record EIO", faults.Rule{Kind: faults.Writes, PathContains: "/zinf-optim-", Nth: 2, Err: syscall.EIO}, false},
		{"optimizer write ENOSPC, max_in_cpu cache", faults.Rule{Kind: faults.Writes, PathContains: "/zinf-optim-", Err: syscall.ENOSPC}, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			ctx, watch := watchdog(t, time.Minute)
			cfg, _ := testConfig(t)
			cfg.ZeroOptimization.SubGroupSize = 4000
			if c.cache {
				cfg.ZeroOptimization.OffloadParam.MaxInCPU = 1 << 20
				cfg.Zinf.Tiers.CPUPinnedBytes = 32 << 20
			}
			inj := faults.New(1)
			model := oneTensor("w", 10_007)
			rt, err := zinf.Open(cfg, model, zinf.Options{Faults: inj, NoBandwidthProbe: true, Logger: quietLog})
			if err != nil {
				t.Fatal(err)
			}
			defer rt.Close()
			watch(rt)
			pinned := rt.Metrics().PinnedInUseBytes
			values := make([]float32, 10_007)
			for i := range values {
				values[i] = float32(i) * 1e-3
			}
			inj.Add(c.rule)
			err = rt.Init(ctx, "w", values)
			if !errors.Is(err, aio.ErrNoSpace) && !errors.Is(err, aio.ErrIO) || !strings.Contains(err.Error(), `"w"`) {
				t.Fatalf("Init on a failing disk: %v", err)
			}
			for what, names := range map[string][]string{"param": rt.ParamStore.Names(), "optimizer": rt.OptimStore.Names(), "grad": rt.GradStore.Names()} {
				if len(names) != 0 {
					t.Errorf("the failed Init left %v in the %s store", names, what)
				}
			}
			if got := rt.Metrics().PinnedInUseBytes; got != pinned {
				t.Errorf("the failed Init holds %d pinned bytes (before: %d)", got, pinned)
			}
			inj.Clear()
			if err := rt.Init(ctx, "w", values); err != nil {
				t.Fatalf("Init after space returned: %v", err)
			}
			if names := rt.ParamStore.Names(); !slices.ContainsFunc(names, func(n string) bool { return strings.Contains(n, "w") }) {
				t.Errorf("param store after Init: %v", names)
			}
		})
	}
}

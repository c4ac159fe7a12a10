package main

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"testing"

	"github.com/zinfio/zinf/internal/base/memlimit"
	"github.com/zinfio/zinf/internal/test/testenv"
)

// TestUlimitV: under ulimit -v (RLIMIT_AS) 3 GiB above what the process
// maps at start, with more memory available than that, sizes beyond the
// limit are refused before anything is allocated, naming the flag or
// config key, both figures and the limit: `zinf io --naive --size 16GiB`
// used to end in a Go fatal out-of-memory, and a pinned pool beyond it in
// one too. Real children, real limit.
func TestUlimitV(t *testing.T) {
	const extra = 3 << 30
	avail, ok := memlimit.Source{Rlimit: func(int) (uint64, bool) { return 0, false }}.Available()
	if !ok || avail.Bytes < extra+(1<<30) {
		t.Skipf("the limit must be the tightest: %s available here", avail.What)
	}
	dir := t.TempDir()
	cfg := filepath.Join(t.TempDir(), "c.json")
	if err := os.WriteFile(cfg, []byte(fmt.Sprintf(`{"zero_optimization": {"stage": 3, "offload_param": {"device": "nvme", "nvme_path": %q},
		"offload_optimizer": {"device": "nvme", "nvme_path": %q}}, "zinf": {"tiers": {"cpu_pinned_bytes": "8GiB"}}}`, dir, dir)), 0o600); err != nil {
		t.Fatal(err)
	}
	env := []string{childASExtraEnv + "=" + strconv.Itoa(extra)}
	for _, c := range []struct {
		args []string
		want []string
	}{
		{[]string{"io", "--path", dir, "--naive", "--size", "16GiB", "--op", "write", "--direct", "off"},
			[]string{"--size 16GiB needs", "ulimit -v (RLIMIT_AS)", "choose a smaller --size"}},
		{[]string{"train", "--config", cfg, "--steps", "1", "--layers", "2", "--width", "64"},
			[]string{"zinf.tiers.cpu_pinned_bytes = 8 GiB (8589934592 bytes)", "ulimit -v (RLIMIT_AS)", "lower zinf.tiers.cpu_pinned_bytes"}},
		{[]string{"infer", "--config", cfg, "--layers", "2", "--width", "64"},
			[]string{"zinf.tiers.cpu_pinned_bytes = 8 GiB (8589934592 bytes)", "ulimit -v (RLIMIT_AS)"}},
	} {
		code, out, errs := runChildEnv(t, env, c.args...)
		if code != 1 {
			t.Errorf("%q under ulimit -v: exit %d, want 1:\nstdout %s\nstderr %s", c.args, code, out, errs)
			continue
		}
		wantAll(t, fmt.Sprintf("%q", c.args), errs, c.want...)
	}
	if got := tree(t, dir); !slices.Equal(got, []string{"."}) {
		t.Fatalf("refused runs left %v", got)
	}
}

// TestPinnedPoolInCgroup: in a 2 GiB memory cgroup (faked), a 3 GiB pinned
// pool is refused before anything is built, naming the key, both figures
// and the cgroup (it used to be OOM-killed once locked); at world size 2
// every rank's pool counts.
func TestPinnedPoolInCgroup(t *testing.T) {
	testenv.FakeCgroup(t, 2<<30, 0)
	dir := t.TempDir()
	write := func(pool string) string {
		p := filepath.Join(t.TempDir(), "c.json")
		os.WriteFile(p, []byte(fmt.Sprintf(`{"zero_optimization": {"stage": 3, "offload_param": {"device": "nvme", "nvme_path": %q},
			"offload_optimizer": {"device": "nvme", "nvme_path": %q}}, "zinf": {"tiers": {"cpu_pinned_bytes": %q}}}`, dir, dir, pool)), 0o600)
		return p
	}
	code, _, errs := runCLI(t, "train", "--config", write("3GiB"), "--steps", "1", "--layers", "2", "--width", "64")
	if code != 1 {
		t.Fatalf("a 3 GiB pool in a 2 GiB cgroup: exit %d\n%s", code, errs)
	}
	wantAll(t, "3 GiB pool", errs, "zinf.tiers.cpu_pinned_bytes = 3 GiB", "2 GiB (2147483648 bytes) of memory available", "cgroup v2", "memory.max")
	t.Setenv("WORLD_SIZE", "2")
	code, _, errs = runCLI(t, "train", "--config", write("1536MiB"), "--steps", "1", "--layers", "2", "--width", "64")
	if code != 1 {
		t.Fatalf("two 1.5 GiB pools in a 2 GiB cgroup: exit %d\n%s", code, errs)
	}
	wantAll(t, "two pools", errs, "for each of the 2 ranks", "3 GiB (3221225472 bytes) in all")
	if got := tree(t, dir); !slices.Equal(got, []string{"."}) {
		t.Fatalf("refused runs left %v", got)
	}
	// zinf plan prints the plan and says Open would refuse the pool here.
	t.Setenv("WORLD_SIZE", "1")
	code, out, errs := runCLI(t, "plan", "--config", write("3GiB"), "--no-probe", "--model", "layers=2,width=64")
	if code != 0 {
		t.Fatalf("plan: exit %d\n%s", code, errs)
	}
	wantAll(t, "plan of a 3 GiB pool", out, "TIER", "Open refuses this config on this machine: zinf.tiers.cpu_pinned_bytes = 3 GiB", "cgroup v2")
}

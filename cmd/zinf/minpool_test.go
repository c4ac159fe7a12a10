package main

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/zinfio/zinf/config"
)

// TestTrainAtPlannedMinimumPool: the minimum pool `zinf plan` prints is
// the pool `zinf train` needs: with exactly that cpu_pinned_bytes the
// model trains, bit for bit as in memory; one 4 KiB block less is refused
// before training, naming the key and the same minimum.
func TestTrainAtPlannedMinimumPool(t *testing.T) {
	dir := t.TempDir()
	writeCfg := func(pool string) string {
		p := filepath.Join(t.TempDir(), "ds.json")
		os.WriteFile(p, []byte(`{"zero_optimization": {"stage": 3, "sub_group_size": 30000,
			"offload_param": {"device": "nvme", "nvme_path": "`+dir+`", "max_in_cpu": 0},
			"offload_optimizer": {"device": "nvme", "nvme_path": "`+dir+`"}},
			"zinf": {"device": "sim", "tiers": {"cpu_pinned_bytes": `+pool+`}, "bandwidth": {"probe": false}}}`), 0o644)
		return p
	}
	code, out, errs := runCLI(t, "plan", "--config", writeCfg(`"256MiB"`), "--model", "layers=3,width=300,dtype=fp32")
	if code != 0 {
		t.Fatalf("plan: exit %d:\n%s", code, errs)
	}
	m := regexp.MustCompile(`minimum pool\s+(\S+) \(zinf.tiers.cpu_pinned_bytes`).FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("plan prints no minimum pool:\n%s", out)
	}
	minPool, err := config.ParseSize(m[1])
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("zinf plan: minimum pool %s = %d bytes", m[1], minPool)

	code, out, errs = runCLI(t, "train", "--config", writeCfg(fmt.Sprint(minPool)), "--layers", "3", "--width", "300", "--steps", "3", "--verify", "--quiet")
	if code != 0 {
		t.Fatalf("train at the planned minimum %d: exit %d:\n%s", minPool, code, errs)
	}
	wantAll(t, "train", out, "BIT FOR BIT")

	code, out, errs = runCLI(t, "train", "--config", writeCfg(fmt.Sprint(minPool-4096)), "--layers", "3", "--width", "300", "--steps", "1")
	if code == 0 {
		t.Fatalf("train one block below the planned minimum %d succeeded", minPool)
	}
	wantAll(t, "the refusal", errs, "zinf.tiers.cpu_pinned_bytes", fmt.Sprintf("(%d bytes)", minPool))
	if strings.Contains(out, "loss ") {
		t.Errorf("the refusal came after training started:\n%s", out)
	}
}

package checkpoint

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// memHelperEnv selects the memory-bounded helper mode of the test binary:
// the value is "verify|DIR" (cap the address space at memHelperBudget more
// than now, then Open and Verify DIR and print the errors) or "probe" (cap
// it, then allocate and touch more than the cap: the helper must die,
// which shows the cap works).
const memHelperEnv = "ZINF_CHECKPOINT_MEM_HELPER"

// memHelperBudget is what a memory-bounded helper may allocate: ample for
// reading a small checkpoint, far below what a trusted 1 TiB length would
// ask for.
const memHelperBudget = 1 << 30

func memHelper(arg string) int {
	if err := limitAddressSpace(memHelperBudget); err != nil {
		fmt.Println("NOLIMIT", err)
		return 0
	}
	mode, dir, _ := strings.Cut(arg, "|")
	switch mode {
	case "probe":
		b := make([]byte, 2*memHelperBudget)
		for i := 0; i < len(b); i += 4096 {
			b[i] = 1
		}
		fmt.Println("ALLOCATED", len(b))
		return 0
	case "verify":
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if r, err := Open(dir); err == nil {
			r.Close()
			fmt.Println("OPEN ok")
		} else {
			fmt.Printf("OPEN corrupt=%v %v\n", errors.Is(err, ErrCorrupt), err)
		}
		_, err := Verify(ctx, dir)
		fmt.Printf("VERIFY corrupt=%v %v\n", errors.Is(err, ErrCorrupt), err)
		return 0
	}
	fmt.Println("bad helper argument", arg)
	return 2
}

// runMemHelper runs the helper in a child process and returns its output;
// a child that dies (out of memory under its cap, say) fails the test.
func runMemHelper(t *testing.T, arg string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), memHelperEnv+"="+arg)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	if strings.HasPrefix(out.String(), "NOLIMIT") {
		t.Skipf("cannot cap a child's memory here: %s", out.String())
	}
	return out.String(), err
}

// editRankManifest rewrites rank 0's manifest of the checkpoint dir with
// edit, then records its new size and checksum in checkpoint.json, as a
// deliberate forger would.
func editRankManifest(t *testing.T, dir string, edit func(m *RankManifest)) {
	t.Helper()
	mp := filepath.Join(dir, rankDirName(0), manifestFile)
	b, err := os.ReadFile(mp)
	if err != nil {
		t.Fatal(err)
	}
	var m RankManifest
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	edit(&m)
	if b, err = json.MarshalIndent(&m, "", "  "); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(mp, b, 0o644); err != nil {
		t.Fatal(err)
	}
	ip := filepath.Join(dir, indexFile)
	ib, err := os.ReadFile(ip)
	if err != nil {
		t.Fatal(err)
	}
	var idx Manifest
	if err := json.Unmarshal(ib, &idx); err != nil {
		t.Fatal(err)
	}
	idx.Ranks[0].ManifestBytes = int64(len(b))
	idx.Ranks[0].ManifestCRC32C = crc32.Checksum(b, castagnoli)
	if ib, err = json.MarshalIndent(&idx, "", "  "); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(ip, ib, 0o644); err != nil {
		t.Fatal(err)
	}
}

// sparse extends path to size bytes without writing them, or skips the
// test where the filesystem cannot hold such a file.
func sparse(t *testing.T, path string, size int64) {
	t.Helper()
	if err := os.Truncate(path, size); err != nil {
		t.Skipf("no sparse file of %d bytes here: %v", size, err)
	}
}

// Lengths read from a checkpoint are bounded before anything is
// allocated: crafted checkpoints whose manifests are internally consistent
// (checksums recomputed) but claim a 1 TiB header, a 1 TiB manifest, a
// 1 TiB index, or tensor sizes that overflow, fail Open and Verify with a
// clear ErrCorrupt inside a child process whose memory is capped, so a
// regression fails the test instead of exhausting the machine.
func TestCraftedLengthsBounded(t *testing.T) {
	if testing.Short() {
		t.Skip("subprocess test skipped in -short mode")
	}
	const tib = int64(1) << 40
	base := t.TempDir()
	fresh := func(name string) string {
		t.Helper()
		dir := filepath.Join(base, name)
		specs := makeSpecs(rand.New(rand.NewPCG(8, 8)), []string{"params.safetensors"}, []int{4096})
		if _, err := Save(context.Background(), dir, stateOf(1, specs, fromMemory), SaveOptions{}); err != nil {
			t.Fatal(err)
		}
		return dir
	}
	cases := []struct {
		name  string
		craft func(dir string)
		want  string
	}{
		{"header_bytes 1 TiB", func(dir string) {
			// The reproduction: the file is 1 TiB long (sparse)
			// and its header said to fill it all.
			editRankManifest(t, dir, func(m *RankManifest) {
				m.Files[0].Bytes, m.Files[0].HeaderBytes = tib, tib-m.Tensors[0].Bytes
				m.Tensors[0].Offset = m.Files[0].HeaderBytes
			})
			sparse(t, filepath.Join(dir, rankDirName(0), "params.safetensors"), tib)
		}, "exceeds the safetensors header limit"},
		{"manifest 1 TiB", func(dir string) {
			sparse(t, filepath.Join(dir, rankDirName(0), manifestFile), tib)
		}, "more than the limit"},
		{"index 1 TiB", func(dir string) {
			sparse(t, filepath.Join(dir, indexFile), tib)
		}, "more than the limit"},
		{"tensor bytes past the file", func(dir string) {
			editRankManifest(t, dir, func(m *RankManifest) {
				m.Tensors[0].Shape = []int64{1<<61 - 1}
				m.Tensors[0].Bytes = (1<<61 - 1) * 4
			})
		}, "run past the end"},
		{"shape overflow", func(dir string) {
			editRankManifest(t, dir, func(m *RankManifest) {
				m.Tensors[0].Shape = []int64{1 << 32, 1 << 32}
			})
		}, "too many elements"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dir := fresh(strings.ReplaceAll(c.name, " ", "-"))
			c.craft(dir)
			out, err := runMemHelper(t, "verify|"+dir)
			if err != nil {
				t.Fatalf("the reader died on a crafted checkpoint (%v):\n%s", err, out)
			}
			for _, l := range []string{"OPEN corrupt=true", "VERIFY corrupt=true", c.want} {
				if !strings.Contains(out, l) {
					t.Errorf("output lacks %q:\n%s", l, out)
				}
			}
			t.Log(out)
		})
	}
}

// The memory cap the crafted-checkpoint test relies on is real: a child
// that allocates past it dies.
func TestMemHelperCapWorks(t *testing.T) {
	if testing.Short() {
		t.Skip("subprocess test skipped in -short mode")
	}
	out, err := runMemHelper(t, "probe")
	if err == nil || strings.Contains(out, "ALLOCATED") {
		t.Fatalf("a child allocating twice its cap survived: %v\n%s", err, out)
	}
}

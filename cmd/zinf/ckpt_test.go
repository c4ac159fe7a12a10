package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/zinfio/zinf/checkpoint"
	"github.com/zinfio/zinf/cmd/zinf/internal/ckptbench"
	"github.com/zinfio/zinf/swapper"
)

// runZinf runs the command line and returns its exit code and output.
func runZinf(args ...string) (int, string, string) {
	var stdout, stderr bytes.Buffer
	code := run(args, &stdout, &stderr)
	return code, stdout.String(), stderr.String()
}

// writeCkpt saves a two-rank checkpoint and returns its directory.
func writeCkpt(t *testing.T) string {
	t.Helper()
	data := func(n int) []byte {
		b := make([]byte, n)
		for i := range b {
			b[i] = byte(i * 7)
		}
		return b
	}
	var ranks []checkpoint.RankState
	for r := range 2 {
		ranks = append(ranks, checkpoint.RankState{Rank: r, Files: []checkpoint.TensorFile{
			{Name: "params.safetensors", Tensors: []checkpoint.Tensor{
				checkpoint.FromBytes("layer0.weight", swapper.BFloat16, []int64{64, 32}, data(64*32*2)),
				checkpoint.FromBytes("layer0.bias", swapper.Float32, []int64{64}, data(64*4)),
			}},
			{Name: "optimizer.safetensors", Tensors: []checkpoint.Tensor{
				checkpoint.FromBytes("layer0.weight.exp_avg", swapper.Float32, []int64{64, 32}, data(64*32*4)),
			}},
		}})
	}
	dir := filepath.Join(t.TempDir(), "step-000010")
	if _, err := checkpoint.Save(context.Background(), dir, checkpoint.State{Step: 10, Ranks: ranks, User: map[string]string{"run": "cli-test"}}, checkpoint.SaveOptions{}); err != nil {
		t.Fatal(err)
	}
	return dir
}

// flipTensorByte flips one byte in the middle of a tensor's data.
func flipTensorByte(t *testing.T, dir string, rank int, tensor string) {
	t.Helper()
	r, err := checkpoint.OpenRank(dir, rank)
	if err != nil {
		t.Fatal(err)
	}
	ti, err := r.Tensor(tensor)
	rankDir := r.Meta().RankDir
	r.Close()
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(filepath.Join(rankDir, ti.File), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	b := []byte{0}
	off := ti.Offset + ti.Bytes/2
	if _, err := f.ReadAt(b, off); err != nil {
		t.Fatal(err)
	}
	b[0] ^= 0x01
	if _, err := f.WriteAt(b, off); err != nil {
		t.Fatal(err)
	}
}

func TestCkptVerifyAndInspect(t *testing.T) {
	dir := writeCkpt(t)
	code, out, errs := runZinf("ckpt", "verify", dir)
	if code != 0 || !strings.Contains(out, "ok ") || !strings.Contains(out, "6 tensors") {
		t.Fatalf("verify: exit %d, stdout %q, stderr %q", code, out, errs)
	}
	code, out, errs = runZinf("ckpt", "inspect", dir)
	if code != 0 || !strings.Contains(out, "layer0.weight.exp_avg") || !strings.Contains(out, "[64 32]") ||
		!strings.Contains(out, `user run = "cli-test"`) || !strings.Contains(out, "all checksums match") {
		t.Fatalf("inspect: exit %d, stdout %q, stderr %q", code, out, errs)
	}
	code, out, _ = runZinf("ckpt", "verify", "--json", dir)
	var rep struct {
		OK      bool `json:"ok"`
		Tensors int  `json:"tensors"`
	}
	if code != 0 || json.Unmarshal([]byte(out), &rep) != nil || !rep.OK || rep.Tensors != 6 {
		t.Fatalf("verify --json: exit %d, %q", code, out)
	}
}

func TestCkptBadInput(t *testing.T) {
	foreign := t.TempDir()
	if err := os.WriteFile(filepath.Join(foreign, "model.bin"), []byte("not a checkpoint"), 0o644); err != nil {
		t.Fatal(err)
	}
	corrupt := writeCkpt(t)
	flipTensorByte(t, corrupt, 1, "layer0.bias")
	for _, c := range []struct {
		name string
		args []string
		want string // in stdout+stderr
	}{
		{"missing-dir", []string{"ckpt", "verify", filepath.Join(foreign, "nope")}, "not a zinf checkpoint"},
		{"foreign-dir", []string{"ckpt", "verify", foreign}, "not a zinf checkpoint"},
		{"inspect-foreign", []string{"ckpt", "inspect", foreign}, "not a zinf checkpoint"},
		{"flipped-byte", []string{"ckpt", "verify", corrupt}, `"layer0.bias"`},
		{"flipped-byte-inspect", []string{"ckpt", "inspect", corrupt}, "BAD"},
		{"flipped-byte-json", []string{"ckpt", "verify", corrupt, "--json"}, `"tensor":"layer0.bias"`},
		{"no-dir", []string{"ckpt", "verify"}, "exactly one"},
		{"two-dirs", []string{"ckpt", "verify", foreign, corrupt}, "exactly one"},
		{"unknown-action", []string{"ckpt", "frobnicate"}, "unknown action"},
		{"no-action", []string{"ckpt"}, "Usage"},
		{"save-bench-no-path", []string{"ckpt", "save-bench"}, "--path is required"},
		{"save-bench-bad-size", []string{"ckpt", "save-bench", "--path", foreign, "--size", "lots"}, "invalid value"},
		{"save-bench-bad-staging", []string{"ckpt", "save-bench", "--path", foreign, "--size", "1MiB", "--staging-bytes", "1000"}, "--staging-bytes 1000"},
		{"bench-no-path", []string{"ckpt", "bench"}, "--path is required"},
	} {
		code, out, errs := runZinf(c.args...)
		if code == 0 || !strings.Contains(out+errs, c.want) {
			t.Errorf("%s: exit %d, want non-zero and %q in the output; stdout %q stderr %q", c.name, code, c.want, out, errs)
		}
	}
	// The corrupt one names the file and the rank too.
	_, out, errs := runZinf("ckpt", "verify", corrupt)
	if !strings.Contains(out+errs, "rank 1") || !strings.Contains(out+errs, "params.safetensors") {
		t.Errorf("verify of a flipped byte does not say where: %q %q", out, errs)
	}
	if code, out, _ := runZinf("ckpt", "-h"); code != 0 || !strings.Contains(out, "save-bench") {
		t.Errorf("ckpt -h: exit %d, %q", code, out)
	}
}

func TestCkptSaveBench(t *testing.T) {
	dir := t.TempDir()
	code, out, errs := runZinf("ckpt", "save-bench", "--path", dir, "--size", "8MiB", "--staging-bytes", "1MiB", "--naive", "--json")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	var res struct {
		Zinf  ckptbench.BenchResult  `json:"zinf"`
		Naive *ckptbench.BenchResult `json:"naive"`
	}
	if err := json.Unmarshal([]byte(out), &res); err != nil || res.Zinf.Bytes < 8<<20 || res.Zinf.GBps <= 0 || res.Naive == nil || res.Naive.GBps <= 0 {
		t.Fatalf("save-bench --json: %v %q", err, out)
	}
	code, out, errs = runZinf("ckpt", "save-bench", "--path", dir, "--size", "4MiB", "--staging-bytes", "1MiB")
	if code != 0 || !strings.Contains(out, "GB/s") {
		t.Fatalf("save-bench: exit %d, %q %q", code, out, errs)
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 0 {
		t.Fatalf("save-bench left %d entries in %s", len(entries), dir)
	}
}

// TestCkptBench runs the interleaved comparison at a small size (with fio
// when it is installed) and checks the table's rows.
func TestCkptBench(t *testing.T) {
	dir := t.TempDir()
	args := []string{"ckpt", "bench", "--path", dir, "--size", "8MiB", "--rounds", "2", "--staging-bytes", "1MiB"}
	_, noFio := exec.LookPath("fio")
	if noFio != nil {
		args = append(args, "--no-fio")
	}
	code, out, errs := runZinf(args...)
	if code != 0 {
		if strings.Contains(errs, "O_DIRECT") {
			t.Skipf("no O_DIRECT on %s: %s", dir, errs)
		}
		t.Fatalf("exit %d: %s", code, errs)
	}
	for _, want := range []string{"zinf Save", "naive Go", "SaveAsync held the caller"} {
		if !strings.Contains(out, want) {
			t.Errorf("bench output lacks %q:\n%s", want, out)
		}
	}
	if noFio == nil && !strings.Contains(out, "fio write") {
		t.Errorf("bench output lacks fio:\n%s", out)
	}
	t.Log("\n" + out)
	if entries, _ := os.ReadDir(dir); len(entries) != 0 {
		t.Fatalf("bench left %d entries in %s", len(entries), dir)
	}
}

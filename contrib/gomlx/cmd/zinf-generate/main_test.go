package main

import (
	"bytes"
	"context"
	"encoding/binary"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gomlx/compute"

	"github.com/zinfio/zinf"
	"github.com/zinfio/zinf/checkpoint"
	"github.com/zinfio/zinf/contrib/gomlx/generate"
	"github.com/zinfio/zinf/tensor"
)

func runCLI(t *testing.T, args ...string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 4*time.Minute)
	defer cancel()
	var out, errs bytes.Buffer
	err := run(ctx, append([]string{"--dir", t.TempDir()}, args...), &out, &errs)
	// Standard error first: the log's lines (a warning of the portable
	// build, say) come before the output whose last line tests read.
	return errs.String() + out.String(), err
}

// TestGenerateVerify: a fresh model generates for a batch of prompts with
// its weights on NVMe through a pool smaller than the weights, prints the
// text, tokens/s and the prediction, and its greedy tokens equal GoMLX's
// in-memory generation (the last line).
func TestGenerateVerify(t *testing.T) {
	prompts := filepath.Join(t.TempDir(), "prompts.txt")
	if err := os.WriteFile(prompts, []byte("And God said\n\nLet there be light\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := runCLI(t, "--model", "dim=64,layers=3,heads=4,kv-heads=2,ffn=128", "--pool", "256KiB", "--prompt", "In the beginning",
		"--prompts-file", prompts, "--max-new-tokens", "8", "--batch", "auto", "--verify")
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	for _, want := range []string{"weights / pool = ", "plan: batch 3 (every sequence): predicted ", `[0] "In the beginning" -> `, `[2] "Let there be light" -> `,
		"tokens/s: ", "step   0 prefill"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if last := lines[len(lines)-1]; last != "greedy tokens equal in-memory generation: true" {
		t.Fatalf("last line %q:\n%s", last, out)
	}
}

// TestBadFlags: bad flags are refused naming the flag, the value and what
// is allowed.
func TestBadFlags(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--prompt", "x", "--model", "layers=0"}, `layers="0" (allowed: 1..4096)`},
		{[]string{"--prompt", "x", "--model", "colour=red"}, `unknown key "colour"`},
		{[]string{"--prompt", "x", "--model", "vocab=100"}, "vocab=100: byte-level text needs at least 256"},
		{[]string{"--prompt", "x", "--strategy", "beam_search"}, `--strategy "beam_search" (allowed: greedy, temperature, top_k, top_p)`},
		{[]string{"--prompt", "x", "--top-p", "2"}, "--top-p 2 (allowed: 0 < p <= 1)"},
		{[]string{"--prompt", "x", "--batch", "many"}, `--batch "many" (allowed: a count >= 0, or auto)`},
		{[]string{"--prompt", "x", "--eos", "a"}, `--eos: "a" is not a token id`},
		{[]string{}, "no prompt: give --prompt or --prompts-file"},
		{[]string{"--prompts-file", "/nonexistent/p.txt"}, "--prompts-file"},
		{[]string{"--prompt", "x", "--checkpoint", "/nonexistent/ckpt"}, "/nonexistent/ckpt"},
		{[]string{"--prompt", "x", "--names", "torch"}, `--names "torch" (allowed: hf, vars)`},
		{[]string{"--prompt", "x", "--mmap", "eager", "--safetensors", "m.st", "--names", "vars"}, `--mmap: mmap advice "eager" (allowed: plain, sequential, willneed)`},
		{[]string{"--prompt", "x", "--mmap", "plain"}, "--mmap maps a --safetensors file holding the model's variable paths"},
		{[]string{"--prompt", "x", "--drop-cache"}, "--drop-cache drops the --safetensors files' pages"},
		{[]string{"--prompt", "x", "--piece-bytes", "-2"}, "--piece-bytes -2 (allowed: -1, 0 or a size in bytes)"},
		{[]string{"--prompt", "x", "--compute-dtype", "fp8"}, `--compute-dtype "fp8" (allowed: fp32, bf16, or empty for the model's`},
		{[]string{"--prompt", "x", "--compute-dtype", "bf16"}, "--compute-dtype BFloat16 for a Float32 model: weights are widened, never narrowed"},
	} {
		out, err := runCLI(t, c.args...)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q: %v (want %q)\n%s", c.args, err, c.want, out)
		}
	}
}

// TestModelJSON: a checkpoint directory as make demo-llm leaves it (a zinf
// checkpoint of a model at the Store's root scope, and model.json naming
// its hyperparameters, cl100k tokenizer and checkpoint) generates text,
// and its greedy tokens equal GoMLX's in-memory generation.
func TestModelJSON(t *testing.T) {
	ctx := t.Context()
	dir := t.TempDir()
	js := `{"model": "zoo transformer", "scope": "/", "tokenizer": "cl100k_base", "vocab": 100277, "embed_dim": 16, "num_layers": 2,
		"num_heads": 2, "head_dim": 8, "ffn_dim": 64, "rope_base_freq": 10000, "final_normalization": "rms", "dtype": "float32",
		"seq_len": 32, "checkpoint": "checkpoint", "steps": 100}`
	if err := os.WriteFile(filepath.Join(dir, "model.json"), []byte(js), 0o644); err != nil {
		t.Fatal(err)
	}
	sp, tok, ckpt, err := loadModelJSON(filepath.Join(dir, "model.json"))
	if err != nil || tok != "cl100k_base" || ckpt != filepath.Join(dir, "checkpoint") || sp.Scope != "" || sp.Norm != "layer" || !sp.Bias || sp.Act != "gelu" {
		t.Fatalf("model.json: %+v %q %q %v", sp, tok, ckpt, err)
	}
	be, err := compute.NewWithConfig("go:ops_sequential")
	if err != nil {
		t.Fatal(err)
	}
	store, err := generate.InitStore(be, sp.Fn(), 3)
	if err != nil {
		t.Fatal(err)
	}
	w := generate.StoreWeights(store)
	var ts []checkpoint.Tensor
	for v := range store.IterVariables() {
		if v.Name() == "#rngState" {
			continue
		}
		gv := generate.Var{Name: v.Path(), Shape: v.Shape()}
		f := make([]float32, gv.Numel())
		if err := w.Read(ctx, gv, f); err != nil {
			t.Fatal(err)
		}
		b := make([]byte, 4*len(f))
		for i, x := range f {
			binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(x))
		}
		shape := make([]int64, v.Shape().Rank())
		for i, d := range v.Shape().Dimensions {
			shape[i] = int64(d)
		}
		ts = append(ts, checkpoint.FromBytes(v.Path(), tensor.Float32, shape, b))
	}
	if _, err := checkpoint.Save(ctx, ckpt, checkpoint.State{Step: 100, Ranks: []checkpoint.RankState{{Rank: 0,
		Files: []checkpoint.TensorFile{{Name: zinf.CheckpointParamsFile, Tensors: ts}}}}}, checkpoint.SaveOptions{}); err != nil {
		t.Fatal(err)
	}
	out, err := runCLI(t, "--checkpoint", dir, "--pool", "8MiB", "--prompt", "And God said", "--prompt", "In the beginning", "--max-new-tokens", "6", "--verify")
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	for _, want := range []string{"tokenizer cl100k_base", "weights from the zinf checkpoint " + ckpt, `[0] "And God said" -> `} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if last := lines[len(lines)-1]; last != "greedy tokens equal in-memory generation: true" {
		t.Fatalf("last line %q:\n%s", last, out)
	}
}

// TestTrace: --trace writes the runtime's timeline (each layer's
// swap-ins and waits) as a Chrome trace-event file.
func TestTrace(t *testing.T) {
	path := filepath.Join(t.TempDir(), "run.json")
	out, err := runCLI(t, "--model", "dim=32,layers=2,heads=4,kv-heads=2,ffn=64", "--pool", "256KiB", "--prompt", "Let there be light",
		"--max-new-tokens", "3", "--progress=false", "--trace", path)
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, "trace: ") || !strings.Contains(string(b), `"traceEvents"`) && !strings.HasPrefix(strings.TrimSpace(string(b)), "[") {
		t.Fatalf("trace file %d bytes:\n%.300s\noutput:\n%s", len(b), b, out)
	}
	if !strings.Contains(string(b), `"cat":"read"`) {
		t.Fatalf("the trace has no weight reads:\n%.600s", b)
	}
	if _, err := runCLI(t, "--model", "dim=32,layers=2,heads=4,kv-heads=2,ffn=64", "--prompt", "x", "--trace", path); err == nil || !strings.Contains(err.Error(), "--trace") {
		t.Fatalf("an existing --trace file: %v", err)
	}
	// --cpuprofile writes a profile pprof reads (gzip's magic first), and
	// never over an existing file.
	prof := filepath.Join(t.TempDir(), "cpu.pprof")
	if out, err := runCLI(t, "--model", "dim=32,layers=2,heads=4,kv-heads=2,ffn=64", "--prompt", "x", "--max-new-tokens", "2", "--cpuprofile", prof); err != nil {
		t.Fatalf("--cpuprofile: %v\n%s", err, out)
	}
	if b, err := os.ReadFile(prof); err != nil || len(b) < 2 || b[0] != 0x1f || b[1] != 0x8b {
		t.Fatalf("--cpuprofile wrote %d bytes (%v), want a gzipped profile", len(b), err)
	}
	if _, err := runCLI(t, "--model", "dim=32,layers=2,heads=4,kv-heads=2,ffn=64", "--prompt", "x", "--cpuprofile", prof); err == nil || !strings.Contains(err.Error(), "--cpuprofile") {
		t.Fatalf("an existing --cpuprofile file: %v", err)
	}
}

// TestMakeModelMmap: --make-model writes a model that zinf reads in place
// (every tensor, --in-place-only) and --mmap maps; both generate the same
// greedy tokens, and each run reports its disk reads and peak RSS (zinf's
// against pool + KV cache + 512 MiB).
func TestMakeModelMmap(t *testing.T) {
	t.Setenv("GOMLX_FUSION", "false")
	st := filepath.Join(t.TempDir(), "model.safetensors")
	spec := "dim=64,layers=3,heads=4,kv-heads=2,ffn=128,dtype=bf16"
	out, err := runCLI(t, "--model", spec, "--make-model", st, "--seed", "3")
	if err != nil || !strings.Contains(out, "of random weights from seed 3") {
		t.Fatalf("%v\n%s", err, out)
	}
	if _, err := runCLI(t, "--model", spec, "--make-model", st); err == nil || !strings.Contains(err.Error(), "exists") {
		t.Fatalf("--make-model over an existing file: %v", err)
	}
	tokens := func(out string) string {
		var ts []string
		for _, l := range strings.Split(out, "\n") {
			if strings.HasPrefix(l, "tokens [") {
				ts = append(ts, l)
			}
		}
		return strings.Join(ts, "\n")
	}
	common := []string{"--model", spec, "--safetensors", st, "--names", "vars", "--prompt", "And God said, 01", "--prompt", "And God said, 02",
		"--max-new-tokens", "8", "--batch", "2", "--drop-cache", "--progress=false"}
	zout, err := runCLI(t, append(common, "--in-place-only", "--piece-bytes", "-1", "--plan=false", "--pool", "1MiB", "--verify")...)
	if err != nil {
		t.Fatalf("%v\n%s", err, zout)
	}
	for _, want := range []string{"read in place from their files by O_DIRECT, 0 copied", "decoding step: median ", "process: read from disk ",
		": within", "greedy tokens equal in-memory generation: true"} {
		if !strings.Contains(zout, want) {
			t.Errorf("zinf's output lacks %q:\n%s", want, zout)
		}
	}
	want := tokens(zout)
	if strings.Count(want, "\n") != 1 {
		t.Fatalf("tokens lines %q:\n%s", want, zout)
	}
	for _, a := range []string{"plain", "sequential", "willneed"} {
		out, err := runCLI(t, append(common, "--mmap", a)...)
		if err != nil {
			t.Fatalf("--mmap %s: %v\n%s", a, err, out)
		}
		if got := tokens(out); got != want {
			t.Errorf("--mmap %s: %q, through zinf %q", a, got, want)
		}
		if !strings.Contains(out, "(mmap, madvise: "+a+")") || !strings.Contains(out, "process: read from disk ") || !strings.Contains(out, "copied from the mapping") {
			t.Errorf("--mmap %s output:\n%s", a, out)
		}
	}
	// The bf16 model computed in float32: the weights read in place as
	// bf16 and widened; zinf, the mapping and the in-memory generation
	// (over the widened weights) agree.
	f32 := append(slices.Clone(common), "--compute-dtype", "fp32")
	zout, err = runCLI(t, append(f32, "--in-place-only", "--piece-bytes", "-1", "--plan=false", "--pool", "1MiB", "--verify")...)
	if err != nil {
		t.Fatalf("--compute-dtype fp32: %v\n%s", err, zout)
	}
	for _, want := range []string{"computed in Float32: each weight widened from BFloat16", "read in place from their files by O_DIRECT, 0 copied", "greedy tokens equal in-memory generation: true"} {
		if !strings.Contains(zout, want) {
			t.Errorf("--compute-dtype fp32: zinf's output lacks %q:\n%s", want, zout)
		}
	}
	mout, err := runCLI(t, append(f32, "--mmap", "willneed")...)
	if err != nil {
		t.Fatalf("--compute-dtype fp32 --mmap willneed: %v\n%s", err, mout)
	}
	if got, want := tokens(mout), tokens(zout); got != want || want == "" {
		t.Errorf("--compute-dtype fp32: mapped %q, through zinf %q", got, want)
	}
}

// TestMaxInCPUFlag: --max-in-cpu keeps part of the weights in the pinned
// pool for good (said on the weights' line), each decoding step then reads
// only the rest, the tokens still equal in-memory generation; with --mmap,
// which has no pool, it is refused by name.
func TestMaxInCPUFlag(t *testing.T) {
	t.Setenv("GOMLX_FUSION", "false")
	st := filepath.Join(t.TempDir(), "model.safetensors")
	spec := "dim=64,layers=4,heads=4,kv-heads=2,ffn=128,dtype=bf16"
	if out, err := runCLI(t, "--model", spec, "--make-model", st, "--seed", "5"); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	common := []string{"--model", spec, "--safetensors", st, "--names", "vars", "--prompt", "And God said, 01", "--max-new-tokens", "6",
		"--progress=false", "--in-place-only", "--piece-bytes", "-1", "--plan=false", "--verify"}
	stepBytes := func(out string) string {
		for _, l := range strings.Split(out, "\n") {
			if i := strings.Index(l, "weights read a decoding step "); i >= 0 {
				return l[i+len("weights read a decoding step "):]
			}
		}
		t.Fatalf("no decoding step line:\n%s", out)
		return ""
	}
	plain, err := runCLI(t, append(common, "--pool", "2MiB")...)
	if err != nil {
		t.Fatalf("%v\n%s", err, plain)
	}
	out, err := runCLI(t, append(common, "--pool", "4MiB", "--max-in-cpu", "512KiB")...)
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	for _, want := range []string{"held in the pinned pool for good, spread over the layers", "(max_in_cpu 0.5 MiB;", "greedy tokens equal in-memory generation: true"} {
		if !strings.Contains(out, want) {
			t.Errorf("--max-in-cpu: the output lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(plain, "held in the pinned pool") {
		t.Errorf("without --max-in-cpu a cache is reported:\n%s", plain)
	}
	if a, b := stepBytes(plain), stepBytes(out); a == b {
		t.Errorf("a decoding step read %s with the cache and without it", a)
	}
	if _, err := runCLI(t, "--model", spec, "--safetensors", st, "--names", "vars", "--prompt", "x", "--mmap", "plain", "--max-in-cpu", "1MiB"); err == nil || !strings.Contains(err.Error(), "--max-in-cpu") {
		t.Fatalf("--max-in-cpu with --mmap: %v", err)
	}
	if _, err := runCLI(t, append(common, "--max-in-cpu", "lots")...); err == nil || !strings.Contains(err.Error(), "max-in-cpu") {
		t.Fatalf("--max-in-cpu lots: %v", err)
	}
}

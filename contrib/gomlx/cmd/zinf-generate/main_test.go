package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func runCLI(t *testing.T, args ...string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 4*time.Minute)
	defer cancel()
	var out, errs bytes.Buffer
	err := run(ctx, append([]string{"--dir", t.TempDir()}, args...), &out, &errs)
	return out.String() + errs.String(), err
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
	} {
		out, err := runCLI(t, c.args...)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q: %v (want %q)\n%s", c.args, err, c.want, out)
		}
	}
}

package main

import (
	"strings"
	"testing"
)

// TestDecoderFlag: --decoder native and gomlx each run (said in the
// decoder line), auto picks native for the standard architecture's
// in-out layers (the decoder's in-out kernels) and an out-in model
// (arch=gemma), and
// --verify holds each to GoMLX's in-memory greedy tokens (and a native
// run's logits to GoMLX's forward pass on the same tokens); a bad value,
// and native with --mmap, are refused naming what is allowed.
func TestDecoderFlag(t *testing.T) {
	for _, c := range []struct{ flag, line string }{
		{"native", "decoder: native (3 layers, 4 heads, 2 kv-heads"},
		{"gomlx", "decoder: gomlx (Options.Decoder gomlx)"},
		{"auto", "decoder: native (3 layers, 4 heads, 2 kv-heads"},
		{"auto --model arch=gemma", "decoder: native (3 layers"},
	} {
		flag, model := c.flag, "dim=64,layers=3,heads=4,kv-heads=2,ffn=128"
		if f, arch, ok := strings.Cut(flag, " --model "); ok {
			flag, model = f, model+","+arch
		}
		out, err := runCLI(t, "--model", model, "--pool", "256KiB", "--prompt", "In the beginning",
			"--prompt", "And God said, ", "--max-new-tokens", "8", "--decoder", flag, "--verify")
		if err != nil {
			t.Fatalf("--decoder %s: %v\n%s", c.flag, err, out)
		}
		lines := strings.Split(strings.TrimSpace(out), "\n")
		if !strings.Contains(out, c.line) || lines[len(lines)-1] != "greedy tokens equal in-memory generation: true" {
			t.Fatalf("--decoder %s: want %q and the tokens equal:\n%s", c.flag, c.line, out)
		}
		// A native run's logits are held to GoMLX's forward pass.
		if native := strings.Contains(c.line, "decoder: native"); native != strings.Contains(out, "native logits against GoMLX's forward pass on the same tokens: 16 positions") ||
			native && !strings.Contains(lines[len(lines)-2], "tolerance 0.0001): within") {
			t.Fatalf("--decoder %s: the logits line:\n%s", c.flag, out)
		}
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--prompt", "x", "--decoder", "fast"}, `--decoder "fast" (allowed: auto, native, gomlx)`},
		{[]string{"--prompt", "x", "--decoder", "native", "--mmap", "plain", "--safetensors", "m.st", "--names", "vars"}, "--decoder native reads the weights in zinf's pinned buffers: not with --mmap"},
	} {
		out, err := runCLI(t, c.args...)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q: %v (want %q)\n%s", c.args, err, c.want, out)
		}
	}
}

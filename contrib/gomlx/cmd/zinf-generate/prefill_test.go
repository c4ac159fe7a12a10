package main

import (
	"strings"
	"testing"
)

// TestPrefillBytesFlag: --prefill-bytes is generate.Options.PrefillBytes:
// a prompt whose prefill needs more is refused before anything is
// generated, naming the flag and the figures; the process line's bound
// counts what the plan allowed the prefill.
func TestPrefillBytesFlag(t *testing.T) {
	model := "vocab=256,dim=32,layers=2"
	long := strings.Repeat("and the earth was without form ", 40) // 1240 byte tokens
	out, err := runCLI(t, "--model", model, "--pool", "4MiB", "--prompt", long, "--max-new-tokens", "2", "--prefill-bytes", "64KiB")
	if err == nil || !strings.Contains(err.Error(), "prefill of 1 prompt(s) of 1240 tokens needs") ||
		!strings.Contains(err.Error(), "over the bound of 0.1 MiB") || !strings.Contains(err.Error(), "--prefill-bytes") {
		t.Fatalf("--prefill-bytes 64KiB: %v (want the prefill refused with the figures and the flag)\n%s", err, out)
	}
	out, err = runCLI(t, "--model", model, "--pool", "4MiB", "--prompt", long, "--max-new-tokens", "2", "--prefill-bytes", "200MiB")
	if err != nil {
		t.Fatalf("--prefill-bytes 200MiB: %v\n%s", err, out)
	}
	if !strings.Contains(out, "bound pool + KV cache + prefill ") || strings.Contains(out, ": OVER") {
		t.Fatalf("the process line does not count the prefill, or is over it:\n%s", out)
	}
	for _, bad := range []string{"-1", "lots"} {
		if out, err := runCLI(t, "--model", model, "--prompt", "x", "--prefill-bytes", bad); err == nil || !strings.Contains(err.Error(), "prefill-bytes") {
			t.Errorf("--prefill-bytes %s: %v (want it refused naming the flag)\n%s", bad, err, out)
		}
	}
}

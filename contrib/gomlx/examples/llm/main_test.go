package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestBibleTrains runs the demo small (the real text and tokenizer, the
// 100277-token vocabulary, one transformer layer, a few steps): the
// held-out loss falls, the offloaded model equals the zoo's trained in
// memory bit for bit (the last line says so), and the checkpoint and
// model.json are where the README says.
func TestBibleTrains(t *testing.T) {
	if _, err := bibleVerses(); errors.Is(err, errNoBible) {
		t.Skipf("skipped: %v", err)
	}
	dir := t.TempDir()
	o := options{steps: 5, dim: 16, layers: 1, heads: 2, batch: 2, seq: 8, verses: 400, heldOut: 40, evalBatches: 1, sample: 2,
		lr: 0.03, seed: 3, dir: dir, prompt: "In the beginning", reference: true}
	var out bytes.Buffer
	if err := run(o, &out); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	s := out.String()
	for _, want := range []string{"tokenizer: cl100k_base", "100277 tokens", "created in zinf layer by layer = the zoo's in-memory initialization: BIT FOR BIT",
		"held-out before: loss", "held-out after:", "step   5/5", "greedy sample: \"In the beginning"} {
		if !strings.Contains(s, want) {
			t.Errorf("the output lacks %q:\n%s", want, s)
		}
	}
	lines := strings.Split(strings.TrimSpace(s), "\n")
	if last := lines[len(lines)-1]; last != "offloaded = in memory BIT FOR BIT" {
		t.Errorf("last line %q:\n%s", last, s)
	}
	var spec Spec
	b, err := os.ReadFile(filepath.Join(dir, "model.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &spec); err != nil {
		t.Fatal(err)
	}
	if spec.Vocab != 100277 || spec.Layers != 1 || spec.Dim != 16 || spec.Checkpoint != "checkpoint" {
		t.Errorf("model.json: %+v", spec)
	}
	if _, err := os.Stat(filepath.Join(dir, "checkpoint")); err != nil {
		t.Errorf("no checkpoint: %v", err)
	}
}

// TestBadFlags: each bad flag is named with its value.
func TestBadFlags(t *testing.T) {
	err := options{dim: 10, heads: 3, layers: 1, batch: 1, seq: 1, evalBatches: 1, lr: 0, compareStates: "4bit"}.check()
	for _, want := range []string{"--steps 0", "--dim 10, --heads 3", "--lr 0", `--compare-states "4bit" (allowed: bf16, 8bit, or empty for none)`} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("check: %v, want %q", err, want)
		}
	}
}

// TestCompareStates runs the demo small with --compare-states 8bit: after
// the fp32 run it trains again with 8-bit Adam moments (the token
// embedding and small tensors in fp32) and prints both held-out losses
// with the verdict against the 2% bar.
func TestCompareStates(t *testing.T) {
	if _, err := bibleVerses(); errors.Is(err, errNoBible) {
		t.Skipf("skipped: %v", err)
	}
	o := options{steps: 5, dim: 64, layers: 1, heads: 2, batch: 2, seq: 8, verses: 400, heldOut: 40, evalBatches: 1, sample: 1,
		lr: 0.01, seed: 3, dir: t.TempDir(), prompt: "In the beginning", compareStates: "8bit"}
	var out bytes.Buffer
	err := run(o, &out)
	s := out.String()
	if !strings.Contains(s, "held-out after 5 steps, Adam moments 8bit (") || !strings.Contains(s, "; fp32 states: ") {
		t.Fatalf("no comparison line (%v):\n%s", err, s)
	}
	if err != nil && !strings.Contains(err.Error(), "with 8bit optimizer states") {
		t.Fatalf("%v\n%s", err, s)
	}
	t.Logf("%s", s[strings.Index(s, "held-out after 5 steps"):])
}

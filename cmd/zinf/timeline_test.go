package main

import (
	"image/png"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestTimeline draws a step of a zinf train --trace file as PNG and SVG
// (the last step by default, or the one asked for), and refuses what it
// cannot draw, naming the flag: no trace, a file that is not one, a step
// or rank the trace does not have, an existing or unknown picture file.
func TestTimeline(t *testing.T) {
	dir := t.TempDir()
	tr := filepath.Join(dir, "run.json")
	if code, _, errs := runCLI(t, "train", "--layers", "3", "--width", "64", "--steps", "2", "--quiet", "--dir", dir, "--trace", tr); code != 0 {
		t.Fatalf("train: exit %d\n%s", code, errs)
	}
	pngPath := filepath.Join(dir, "step.png")
	code, out, errs := runCLI(t, "timeline", "--trace", tr, "--out", pngPath)
	if code != 0 {
		t.Fatalf("exit %d\n%s", code, errs)
	}
	// The last step that took an optimizer step (the run reads the model
	// back after it, which the trace counts as step 3).
	wantAll(t, "stdout", out, "rank 0, step 2 of [1 2 3]")
	f, err := os.Open(pngPath)
	if err != nil {
		t.Fatal(err)
	}
	img, err := png.Decode(f)
	f.Close()
	if err != nil || img.Bounds().Dx() < 800 {
		t.Fatalf("the PNG: %v %v", err, img)
	}
	svg := filepath.Join(dir, "step1.svg")
	if code, _, errs := runCLI(t, "timeline", "--trace", tr, "--out", svg, "--step", "1", "--title", "my run"); code != 0 {
		t.Fatalf("exit %d\n%s", code, errs)
	}
	b, _ := os.ReadFile(svg)
	wantAll(t, "the SVG", string(b), "my run", "param I/O", "compute (backward)")

	notTrace := filepath.Join(dir, "x.json")
	os.WriteFile(notTrace, []byte(`{"a": 1}`), 0o644)
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--out", filepath.Join(dir, "a.svg")}, "--trace is required"},
		{[]string{"--trace", tr}, "--out is required"},
		{[]string{"--trace", tr, "--out", pngPath}, "already exists"},
		{[]string{"--trace", tr, "--out", filepath.Join(dir, "a.gif")}, ".svg, .png"},
		{[]string{"--trace", filepath.Join(dir, "missing.json"), "--out", filepath.Join(dir, "b.svg")}, "no such file"},
		{[]string{"--trace", notTrace, "--out", filepath.Join(dir, "c.svg")}, "not a Chrome trace-event file"},
		{[]string{"--trace", tr, "--out", filepath.Join(dir, "d.svg"), "--step", "9"}, "no events of rank 0 step 9"},
		{[]string{"--trace", tr, "--out", filepath.Join(dir, "e.svg"), "--rank", "3"}, "--rank 3"},
		{[]string{"--trace", tr, "--out", filepath.Join(dir, "f.svg"), "--step", "-1"}, "--step -1"},
	} {
		code, _, errs := runCLI(t, append([]string{"timeline"}, c.args...)...)
		if code == 0 || !strings.Contains(errs, c.want) {
			t.Errorf("%v: exit %d, stderr %q; want an error with %q", c.args, code, errs, c.want)
		}
	}
	for _, n := range []string{"a.svg", "b.svg", "c.svg", "d.svg", "e.svg", "f.svg"} {
		if _, err := os.Stat(filepath.Join(dir, n)); err == nil {
			t.Errorf("a refused run left %s", n)
		}
	}
}

package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"

	"github.com/zinfio/zinf/cmd/zinf/internal/scalebench"
)

func init() {
	register("bench-scale", "train the simulated model with states larger than this machine's memory through a small pinned pool; peak RSS, step time vs the disk-bound prediction (make bench-scale)", runBenchScale)
}

func runBenchScale(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlags("bench-scale", stderr)
	var o scalebench.Options
	var asJSON bool
	fs.StringVar(&o.Dir, "path", "", "directory on the disk to train on (required); the run works in a directory of its own there and removes it")
	sizeVar(fs, &o.StateBytes, "state", 30<<30, "model state to reach at least (20 bytes per fp32 parameter)")
	sizeVar(fs, &o.PoolBytes, "pool", 1<<30, "pinned pool (zinf.tiers.cpu_pinned_bytes)")
	fs.IntVar(&o.Width, "width", 2048, "layer width")
	fs.IntVar(&o.Steps, "steps", 3, "training steps")
	sizeVar(fs, &o.ProbeBytes, "probe-size", 512<<20, "file the bandwidth is measured with before and after training")
	fs.Float64Var(&o.MixedSeconds, "mixed-seconds", scalebench.DefaultMixedSeconds, "seconds of the mixed probe (a file read and another written at once) before and after training; 0: none")
	sizeVar(fs, &o.MixedBytes, "mixed-size", 0, "each of the mixed probe's two files (default: --probe-size); disk only, not memory")
	fs.BoolVar(&asJSON, "json", false, "print one JSON object with the results")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	// Zero would silently mean "the default" below the command line.
	if err := errors.Join(sizeIn("--state", o.StateBytes, 1<<20, 1<<50), sizeIn("--pool", o.PoolBytes, 1<<20, 1<<40),
		intIn("--width", o.Width, 8, 1<<14), intIn("--steps", o.Steps, 1, 1000), sizeIn("--probe-size", o.ProbeBytes, 1<<20, 1<<40)); err != nil {
		return err
	}
	if err := errors.Join(checkMemory("--pool", o.PoolBytes, o.PoolBytes, "the pinned pool"),
		checkMemory("--probe-size", o.ProbeBytes, nextPow2(o.ProbeBytes), "the bandwidth probe's pinned buffer")); err != nil {
		return err
	}
	if o.MixedSeconds < 0 || o.MixedSeconds > 600 {
		return fmt.Errorf("--mixed-seconds %g is invalid (allowed: 0..600; 0: no mixed probe)", o.MixedSeconds)
	}
	if o.MixedSeconds == 0 {
		o.MixedSeconds = -1 // none; zero in Options is the default
	}
	o.Progress = stderr
	if !asJSON {
		o.Progress = stdout
	}
	o.Logger = cliLogger(stderr)
	r, err := scalebench.Run(ctx, o)
	if err != nil {
		return err
	}
	if asJSON {
		return json.NewEncoder(stdout).Encode(r)
	}
	return r.Write(stdout)
}

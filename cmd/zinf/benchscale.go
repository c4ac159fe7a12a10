package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"

	"github.com/zinfio/zinf/cmd/zinf/internal/scalebench"
)

func init() {
	register("bench-scale", "train the simulated model with states larger than this machine's memory through a small pinned pool, fp32 against bf16 params with 8-bit moments and pinned gradients in alternating blocks; peak RSS, step time vs the disk-bound prediction, bytes per parameter at the disk vs the plan (make bench-scale)", runBenchScale)
}

func runBenchScale(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlags("bench-scale", stderr)
	var o scalebench.Options
	var asJSON bool
	var configs string
	var rounds int
	fs.StringVar(&o.Dir, "path", "", "directory on the disk to train on (required); the run works in a directory of its own there and removes it")
	sizeVar(fs, &o.StateBytes, "state", 30<<30, "model state to reach at least (20 bytes per fp32 parameter)")
	sizeVar(fs, &o.PoolBytes, "pool", 1<<30, "pinned pool (zinf.tiers.cpu_pinned_bytes)")
	fs.IntVar(&o.Width, "width", 2048, "layer width")
	fs.IntVar(&o.Steps, "steps", 3, "training steps (per block with two --configs)")
	fs.StringVar(&configs, "configs", "fp32,compact", "configurations to train, comma-separated: fp32 (fp32 params and states, every gradient through NVMe) and compact (bf16 params, 8-bit moments, gradients kept pinned); two are compared on the same model in alternating blocks of --steps")
	fs.IntVar(&rounds, "rounds", 2, "blocks of --steps steps per configuration when comparing two (the order reverses every round)")
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
	variants := strings.Split(configs, ",")
	for i := range variants {
		variants[i] = strings.TrimSpace(variants[i])
		if !slices.Contains(scalebench.Variants, variants[i]) {
			return fmt.Errorf("--configs %q is invalid: %q is not a configuration (allowed: %s, comma-separated)", configs, variants[i], strings.Join(scalebench.Variants, ", "))
		}
		if slices.Contains(variants[:i], variants[i]) {
			return fmt.Errorf("--configs %q is invalid: it names %q twice", configs, variants[i])
		}
	}
	if err := intIn("--rounds", rounds, 1, 100); err != nil {
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
	if len(variants) > 1 {
		c, err := scalebench.Compare(ctx, scalebench.CompareOptions{Options: o, Variants: variants, Rounds: rounds})
		if err != nil {
			return err
		}
		if asJSON {
			return json.NewEncoder(stdout).Encode(c)
		}
		return c.Write(stdout)
	}
	o.Variant = variants[0]
	r, err := scalebench.Run(ctx, o)
	if err != nil {
		return err
	}
	if asJSON {
		return json.NewEncoder(stdout).Encode(r)
	}
	return r.Write(stdout)
}

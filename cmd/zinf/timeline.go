package main

import (
	"context"
	"errors"
	"fmt"
	"io"

	"github.com/zinfio/zinf/cmd/zinf/internal/plots"
	"github.com/zinfio/zinf/regfile"
	"github.com/zinfio/zinf/trace"
)

func init() {
	register("timeline", "draw one step of a zinf train --trace file as a picture (.svg or .png)", runTimeline)
}

func runTimeline(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlags("timeline", stderr)
	var in, out, title string
	var step, rank int
	fs.StringVar(&in, "trace", "", "the trace file (zinf train --trace) (required)")
	fs.StringVar(&out, "out", "", "the picture to create: a new .svg or .png file (required)")
	fs.IntVar(&step, "step", 0, "the step to draw, from 1 (default: the last one that took an optimizer step)")
	fs.IntVar(&rank, "rank", 0, "the rank to draw")
	fs.StringVar(&title, "title", "", "the picture's title (default: rank and step)")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	var errs []error
	if in == "" {
		errs = append(errs, errors.New("--trace is required: a file zinf train --trace wrote"))
	}
	if out == "" {
		errs = append(errs, errors.New("--out is required: the .svg or .png file to create"))
	}
	errs = append(errs, checkNewPicture("--out", out), notNegative("--step", step), notNegative("--rank", rank))
	if err := errors.Join(errs...); err != nil {
		return err
	}
	// A regular file only: a named pipe would block the open until a
	// writer came, and a device would never end.
	end := beginBlocking()
	f, _, err := regfile.Open(in)
	if err != nil {
		end()
		return fmt.Errorf("--trace: %w", err)
	}
	events, err := trace.ReadChrome(f)
	f.Close()
	end()
	if err != nil {
		return fmt.Errorf("--trace %s: %w", in, err)
	}
	steps := plots.Steps(events, int32(rank))
	if len(steps) == 0 {
		return fmt.Errorf("--rank %d: the trace %s has no events of that rank", rank, in)
	}
	if step == 0 {
		// The last step that took an optimizer step: what comes after the
		// last one (a final read-back of the model) is not a step.
		step = int(steps[len(steps)-1])
		last := int64(-1)
		for _, e := range events {
			if e.Rank == int32(rank) && e.Kind == trace.Step && !e.Failed {
				last = max(last, e.Step+1)
			}
		}
		if last > 0 {
			step = int(last)
		}
	}
	if err := writePicture("--out", out, func(w io.Writer, format string) error {
		return plots.Timeline(w, format, events, int32(rank), int64(step), title)
	}); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "%s: rank %d, step %d of %v\n", out, rank, step, steps)
	return nil
}

package main

import (
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/zinfio/zinf/internal/base/blockdev"
	"github.com/zinfio/zinf/policy"
)

// diskOf names the disk under a path for the endurance lines ("" when it
// cannot be found: a path on another machine, tmpfs).
func diskOf(path string) string {
	if d, err := blockdev.Of(path); err == nil {
		return d.Name
	}
	return ""
}

// writeEndurance prints what a step's NVMe writes cost the drives: the
// bytes per step, per day at the step time, and against the rating when
// one is given, then how the paths share them (striping gives each path
// an equal share; paths on one disk add up).
func writeEndurance(w io.Writer, what string, writtenPerStep int64, step time.Duration, rating int64, paths []string) {
	e := policy.EnduranceOf(writtenPerStep, step, rating)
	fmt.Fprintf(w, "nvme endurance (%s): %s\n", what, e)
	if len(paths) > 0 {
		var parts []string
		for _, p := range paths {
			if d := diskOf(p); d != "" {
				parts = append(parts, fmt.Sprintf("%s (disk %s)", p, d))
			} else {
				parts = append(parts, p)
			}
		}
		share := "all of it"
		if len(paths) > 1 {
			share = fmt.Sprintf("1/%d each", len(paths))
		}
		fmt.Fprintf(w, "  written to %s: %s\n", strings.Join(parts, ", "), share)
	}
	if rating <= 0 {
		fmt.Fprintln(w, "  give the drives' endurance rating (zinf.nvme_tbw in the config, or --tbw, e.g. 600TB) to set this against it")
	}
}

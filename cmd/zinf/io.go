package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"

	"github.com/zinfio/zinf/internal/iobench"
)

func init() {
	register("io", "measure read or write bandwidth on a path (like DeepNVMe's ds_io)", runIO)
}

func runIO(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlags("io", stderr)
	var (
		o      iobench.Options
		ef     engineFlags
		asJSON bool
	)
	fs.StringVar(&o.Dir, "path", "", "directory on the device to measure (required)")
	sizeVar(fs, &o.SizeBytes, "size", 1<<30, "file and buffer size (e.g. 1GiB, 64MiB)")
	fs.StringVar(&o.Op, "op", "read", "read or write")
	fs.IntVar(&o.Loops, "loops", 5, "timed passes")
	fs.IntVar(&o.Warmup, "warmup", 1, "untimed passes before them")
	fs.BoolVar(&o.Keep, "keep", false, "keep the data file (reads reuse it)")
	fs.StringVar(&o.FileName, "file", "", "file name inside --path (default zinf-io-<size>.dat)")
	fs.BoolVar(&o.Naive, "naive", false, "plain os.File I/O (+fsync; reads after dropping the page cache) for contrast")
	fs.BoolVar(&asJSON, "json", false, "print one JSON object")
	ef.register(fs)
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	eo, err := ef.options()
	if err != nil {
		return err
	}
	o.Engine = eo
	if o.Loops == 0 {
		return fmt.Errorf("--loops must be at least 1")
	}
	if !asJSON {
		o.Progress = stderr
	}
	res, err := iobench.Run(ctx, o)
	if err != nil {
		return err
	}
	if asJSON {
		return json.NewEncoder(stdout).Encode(res)
	}
	fmt.Fprintf(stdout, "%s %s: %d bytes x %d loops, backend %s, block %d, qd %d, parallel %d, O_DIRECT %v (align %d), pinned %v\n",
		res.Op, res.Path, res.Bytes, res.Loops, res.Backend, res.BlockSize, res.QueueDepth, res.Parallel, res.Direct, res.AlignBytes, res.Pinned)
	fmt.Fprintf(stdout, "GB/s: median %.3f  min %.3f  max %.3f\n", res.GBpsMedian, res.GBpsMin, res.GBpsMax)
	if res.CacheNote != "" {
		fmt.Fprintln(stdout, "note:", res.CacheNote)
	}
	return nil
}

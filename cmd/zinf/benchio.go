package main

import (
	"context"
	"fmt"
	"io"

	"github.com/zinfio/zinf/internal/iobench"
)

func init() {
	register("bench-io", "compare zinf io with fio on the same file, interleaved (make bench-io)", runBenchIO)
}

func runBenchIO(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlags("bench-io", stderr)
	var o iobench.CompareOptions
	var bs int64
	fs.StringVar(&o.Dir, "path", "", "directory on the device (required)")
	sizeVar(fs, &o.SizeBytes, "size", 1<<30, "file size")
	sizeVar(fs, &bs, "block-size", 1<<20, "block size for both tools")
	fs.IntVar(&o.QueueDepth, "queue-depth", 32, "queue depth for both tools")
	fs.IntVar(&o.Rounds, "rounds", 5, "interleaved rounds")
	fs.StringVar(&o.FioPath, "fio", "", "fio binary (default: from PATH)")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if o.Dir == "" {
		return fmt.Errorf("--path is required")
	}
	o.BlockSize = int(bs)
	o.Progress = stderr
	r, err := iobench.Compare(ctx, o)
	if err != nil {
		return err
	}
	return r.WriteTable(stdout)
}

package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"

	"github.com/zinfio/zinf/aio"
	"github.com/zinfio/zinf/cmd/zinf/internal/iobench"
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
	fs.IntVar(&o.QueueDepth, "queue-depth", aio.DefaultQueueDepth, "queue depth for both tools")
	fs.IntVar(&o.Rounds, "rounds", 5, "interleaved rounds")
	fs.StringVar(&o.FioPath, "fio", "", "fio binary (default: from PATH)")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if o.Dir == "" {
		return fmt.Errorf("--path is required")
	}
	// Zero would silently mean "the default" below the command line.
	if err := errors.Join(sizeIn("--size", o.SizeBytes, 1, math.MaxInt64), sizeIn("--block-size", bs, 1, 1<<30),
		intIn("--queue-depth", o.QueueDepth, 1, aio.MaxQueueDepth), intIn("--rounds", o.Rounds, 1, maxRounds)); err != nil {
		return err
	}
	// One zinf buffer of --size at a time (a pool rounded up to a power of
	// two), and one file of --size.
	if err := errors.Join(checkMemory("--size", o.SizeBytes, nextPow2(max(o.SizeBytes, 1<<20)), "zinf's buffer (one pinned buffer of --size, in a pool rounded up to a power of two)"),
		checkDisk("--size", o.SizeBytes, o.SizeBytes, o.Dir)); err != nil {
		return err
	}
	o.BlockSize = int(bs)
	o.Progress = stderr
	o.Logger = cliLogger(stderr)
	r, err := iobench.Compare(ctx, o)
	if err != nil {
		return err
	}
	return r.WriteTable(stdout)
}

// maxRounds bounds the interleaved rounds of the comparisons: enough for any
// statistics, and a typo of a few more zeros is caught before hours of I/O.
const maxRounds = 1000

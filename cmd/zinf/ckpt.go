package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math"
	"os"
	"sort"

	"github.com/zinfio/zinf/aio"
	"github.com/zinfio/zinf/checkpoint"
	"github.com/zinfio/zinf/cmd/zinf/internal/ckptbench"
	"github.com/zinfio/zinf/swapper"
)

func init() {
	register("ckpt", "checkpoints: save-bench, bench (against fio), inspect, verify", runCkpt)
}

// ckptActions are the ckpt subcommands.
var ckptActions = map[string]struct {
	summary string
	run     func(ctx context.Context, args []string, stdout, stderr io.Writer) error
}{
	"save-bench": {"save-bench --path DIR --size 4GiB [--naive] [--json]: write a synthetic checkpoint, report GB/s", runCkptSaveBench},
	"bench":      {"bench --path DIR --size 4GiB [--rounds 3]: zinf save vs fio vs naive Go vs async save, interleaved, medians and ratios", runCkptBench},
	"inspect":    {"inspect DIR: metadata, every tensor with dtype, shape, size and checksum, verified", runCkptInspect},
	"verify":     {"verify DIR [--json]: check every byte; exit status 1 naming each problem", runCkptVerify},
}

func ckptUsage(w io.Writer) {
	fmt.Fprintln(w, "Usage: zinf ckpt <action> [flags]\n\nActions:")
	names := make([]string, 0, len(ckptActions))
	for n := range ckptActions {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		fmt.Fprintf(w, "  %s\n", ckptActions[n].summary)
	}
}

func runCkpt(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		ckptUsage(stderr)
		return errUsage
	}
	if args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		ckptUsage(stdout)
		return flag.ErrHelp
	}
	a, ok := ckptActions[args[0]]
	if !ok {
		fmt.Fprintf(stderr, "zinf ckpt: unknown action %q\n\n", args[0])
		ckptUsage(stderr)
		return errUsage
	}
	return a.run(ctx, args[1:], stdout, stderr)
}

// saveFlags are the checkpoint writer's options.
type saveFlags struct {
	stagingBytes int64
	buffers      int
	parallel     int
}

func (s *saveFlags) register(fs *flag.FlagSet) {
	sizeVar(fs, &s.stagingBytes, "staging-bytes", checkpoint.DefaultStagingBytes, "size of each staging buffer and write request")
	fs.IntVar(&s.buffers, "staging-buffers", checkpoint.DefaultStagingBuffers, "staging buffers (writes in flight) per file")
	fs.IntVar(&s.parallel, "parallel", checkpoint.DefaultParallel, "files written at once")
}

// Limits of the checkpoint writer's options (checkpoint.SaveOptions.Validate
// holds the same), stated here so each message names the flag.
const (
	maxStagingBuffers = 1024
	maxSaveParallel   = 256
)

func (s *saveFlags) options(log *slog.Logger) (checkpoint.SaveOptions, error) {
	// Zero would silently mean "the default" below the command line.
	if err := errors.Join(sizeIn("--staging-bytes", s.stagingBytes, 4096, 1<<30), intIn("--staging-buffers", s.buffers, 1, maxStagingBuffers),
		intIn("--parallel", s.parallel, 1, maxSaveParallel)); err != nil {
		return checkpoint.SaveOptions{}, err
	}
	if s.stagingBytes%4096 != 0 {
		return checkpoint.SaveOptions{}, fmt.Errorf("--staging-bytes %s is invalid (allowed: a multiple of 4KiB up to 1GiB)", sizeText(s.stagingBytes))
	}
	o := checkpoint.SaveOptions{StagingBytes: int(s.stagingBytes), StagingBuffers: s.buffers, Parallel: s.parallel, Logger: log}
	o.EnsureDefaults()
	if err := o.Validate(); err != nil {
		return o, err
	}
	// Every file being written holds its staging buffers at once.
	staging := s.stagingBytes * int64(s.buffers) * int64(s.parallel)
	if err := checkMemory("--staging-bytes", s.stagingBytes, staging,
		fmt.Sprintf("the staging buffers (--staging-bytes x --staging-buffers %d x --parallel %d)", s.buffers, s.parallel)); err != nil {
		return o, err
	}
	return o, nil
}

// benchDir makes a private directory for a checkpoint benchmark inside
// --path: the benchmarks write and remove fixed names, which in a shared
// directory could be another user's files or links. Only this directory,
// created by this run, is removed afterwards.
func benchDir(dir string, log *slog.Logger) (string, func(), error) {
	st, err := os.Stat(dir)
	if err != nil {
		return "", nil, fmt.Errorf("--path %q: %w", dir, err)
	}
	if !st.IsDir() {
		return "", nil, fmt.Errorf("--path %q is not a directory", dir)
	}
	// A swapper.RunDir: locked while the run lives, so the next run in
	// --path removes one a killed run left, and zinf doctor counts it.
	rd, err := swapper.NewRunDir(dir, "ckpt-bench", log)
	if err != nil {
		return "", nil, fmt.Errorf("--path %q: creating a private directory for the benchmark: %w", dir, err)
	}
	return rd.Path(), func() { rd.Close() }, nil
}

func runCkptSaveBench(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlags("ckpt save-bench", stderr)
	var (
		dir           string
		size          int64
		naive, asJSON bool
		sf            saveFlags
	)
	fs.StringVar(&dir, "path", "", "directory on the device to write to (required)")
	sizeVar(fs, &size, "size", 4<<30, "checkpoint size (e.g. 4GiB)")
	fs.BoolVar(&naive, "naive", false, "also write it the naive Go way (encoding/binary through bufio to an os.File + fsync)")
	fs.BoolVar(&asJSON, "json", false, "print one JSON object")
	sf.register(fs)
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if dir == "" {
		return errors.New("--path is required")
	}
	if err := sizeIn("--size", size, 1, math.MaxInt64); err != nil {
		return err
	}
	opts, err := sf.options(cliLogger(stderr))
	if err != nil {
		return err
	}
	// The checkpoint goes to disk; the naive writer holds it in memory.
	if err := checkDisk("--size", size, size, dir); err != nil {
		return err
	}
	if naive {
		if err := checkMemory("--size", size, size, "the naive writer's tensors (held in memory)"); err != nil {
			return err
		}
	}
	bdir, cleanup, err := benchDir(dir, cliLogger(stderr))
	if err != nil {
		return err
	}
	defer cleanup()
	res, err := ckptbench.SaveBench(ctx, bdir, size, opts)
	if err != nil {
		return err
	}
	out := struct {
		Zinf  ckptbench.BenchResult  `json:"zinf"`
		Naive *ckptbench.BenchResult `json:"naive,omitempty"`
	}{Zinf: res}
	if naive {
		n, err := ckptbench.NaiveSaveBench(ctx, bdir, size)
		if err != nil {
			return fmt.Errorf("naive: %w", err)
		}
		out.Naive = &n
	}
	if asJSON {
		return json.NewEncoder(stdout).Encode(out)
	}
	fmt.Fprintf(stdout, "zinf save:  %v\n", out.Zinf)
	if out.Naive != nil {
		fmt.Fprintf(stdout, "naive Go:   %v (%.2fx slower)\n", *out.Naive, out.Zinf.GBps/out.Naive.GBps)
	}
	return nil
}

func runCkptBench(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlags("ckpt bench", stderr)
	var (
		o              ckptbench.CompareOptions
		sf             saveFlags
		noNaive, noAsy bool
		asJSON         bool
	)
	fs.StringVar(&o.Dir, "path", "", "directory on the device to write to (required)")
	sizeVar(fs, &o.SizeBytes, "size", 4<<30, "checkpoint size (e.g. 4GiB)")
	fs.IntVar(&o.Rounds, "rounds", 3, "interleaved rounds")
	fs.StringVar(&o.FioPath, "fio", "", "fio binary (default: from PATH)")
	fs.BoolVar(&o.NoFio, "no-fio", false, "skip fio")
	fs.StringVar(&o.FioEngine, "fio-engine", "", "fio ioengine (default io_uring, libaio when zinf's backend is)")
	fs.StringVar(&o.Engine.Backend, "backend", "auto", "zinf I/O backend: auto, uring, libaio, posix")
	var ioBlock int64
	sizeVar(fs, &ioBlock, "io-block-size", 0, "the engine's block size: the pieces a write is split into (default: --staging-bytes, one piece per write, as fio's blocks)")
	fs.IntVar(&o.Engine.QueueDepth, "io-queue-depth", 0, "the engine's pieces in flight per worker (default: staging-buffers x parallel)")
	fs.IntVar(&o.Engine.IntraOpParallelism, "io-parallel", 0, "the engine's workers (rings) (default 1)")
	fs.StringVar(&o.Source, "source", ckptbench.SourceMemory, "where the tensors live: memory (copied by SaveAsync) or store (a swap store on --path: read back by Save, pinned by SaveAsync)")
	fs.BoolVar(&noNaive, "no-naive", false, "skip the naive Go writer")
	fs.BoolVar(&noAsy, "no-async", false, "skip the asynchronous save")
	fs.BoolVar(&o.Cold, "cold", false, "also time a one-shot checkpoint.Save each round (its engine and pinned memory made within the call)")
	fs.BoolVar(&asJSON, "json", false, "print one JSON object (progress still goes to stderr)")
	sf.register(fs)
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if o.Dir == "" {
		return errors.New("--path is required")
	}
	// Zero would silently mean "the default" below the command line; the
	// engine flags default to 0 ("derive it"), so only an explicit 0 is
	// refused there.
	if err := errors.Join(sizeIn("--size", o.SizeBytes, 1, math.MaxInt64), intIn("--rounds", o.Rounds, 1, maxRounds),
		sizeIn("--io-block-size", ioBlock, 0, 1<<30), intIn("--io-queue-depth", o.Engine.QueueDepth, 0, aio.MaxQueueDepth),
		intIn("--io-parallel", o.Engine.IntraOpParallelism, 0, aio.MaxIntraOpParallelism),
		noExplicitZero(fs, "io-block-size", "io-queue-depth", "io-parallel")); err != nil {
		return err
	}
	var err error
	log := cliLogger(stderr)
	if o.Save, err = sf.options(log); err != nil {
		return err
	}
	// Each writer's checkpoint goes to disk in turn; the naive writer and
	// the asynchronous save from memory hold a copy of it in memory.
	if err := checkDisk("--size", o.SizeBytes, o.SizeBytes, o.Dir); err != nil {
		return err
	}
	if !noNaive || !noAsy && o.Source == ckptbench.SourceMemory {
		if err := checkMemory("--size", o.SizeBytes, o.SizeBytes, "the in-memory copy of the checkpoint (the naive writer's tensors and the asynchronous save's snapshot; --no-naive and --no-async skip them)"); err != nil {
			return err
		}
	}
	bdir, cleanup, err := benchDir(o.Dir, log)
	if err != nil {
		return err
	}
	defer cleanup()
	o.Dir = bdir
	o.Engine.Logger = log
	o.Engine.BlockSizeBytes = int(ioBlock)
	o.Naive, o.Async = !noNaive, !noAsy
	o.Progress = stderr
	res, err := ckptbench.CompareSave(ctx, o)
	if err != nil {
		return err
	}
	if asJSON {
		return json.NewEncoder(stdout).Encode(res)
	}
	return res.WriteTable(stdout)
}

// oneDir parses flags and the one positional DIR argument.
func oneDir(fs *flag.FlagSet, args []string) (string, error) {
	// Flags may come before or after DIR.
	var dirs []string
	for {
		if err := fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				return "", err
			}
			return "", errUsage
		}
		if fs.NArg() == 0 {
			break
		}
		dirs = append(dirs, fs.Arg(0))
		args = fs.Args()[1:]
	}
	if len(dirs) != 1 {
		fmt.Fprintf(fs.Output(), "%s: want exactly one checkpoint directory, got %d %q\n", fs.Name(), len(dirs), dirs)
		return "", errUsage
	}
	return dirs[0], nil
}

func runCkptInspect(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlags("ckpt inspect", stderr)
	dir, err := oneDir(fs, args)
	if err != nil {
		return err
	}
	return checkpoint.Inspect(ctx, dir, stdout)
}

func runCkptVerify(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlags("ckpt verify", stderr)
	var asJSON bool
	fs.BoolVar(&asJSON, "json", false, "print one JSON object")
	dir, err := oneDir(fs, args)
	if err != nil {
		return err
	}
	rep, verr := checkpoint.Verify(ctx, dir)
	if asJSON {
		type problem struct {
			Rank   int    `json:"rank"`
			File   string `json:"file,omitempty"`
			Tensor string `json:"tensor,omitempty"`
			Error  string `json:"error"`
		}
		out := struct {
			Dir       string    `json:"dir"`
			OK        bool      `json:"ok"`
			Step      int64     `json:"step"`
			WorldSize int       `json:"world_size"`
			Ranks     int       `json:"ranks"`
			Files     int       `json:"files"`
			Tensors   int       `json:"tensors"`
			Bytes     int64     `json:"bytes"`
			Problems  []problem `json:"problems"`
			Error     string    `json:"error,omitempty"`
		}{Dir: rep.Dir, OK: verr == nil, Step: rep.Step, WorldSize: rep.WorldSize, Ranks: rep.Ranks, Files: rep.Files,
			Tensors: rep.Tensors, Bytes: rep.Bytes, Problems: []problem{}}
		for _, p := range rep.Problems {
			out.Problems = append(out.Problems, problem{p.Rank, p.File, p.Tensor, p.Err.Error()})
		}
		if verr != nil {
			out.Error = verr.Error()
		}
		if err := json.NewEncoder(stdout).Encode(out); err != nil {
			return err
		}
		return verr
	}
	if verr != nil {
		for _, p := range rep.Problems {
			fmt.Fprintf(stdout, "PROBLEM %s\n", p)
		}
		if len(rep.Problems) > 1 {
			return fmt.Errorf("%d problems; first: %w", len(rep.Problems), verr)
		}
		return verr
	}
	fmt.Fprintf(stdout, "ok %s: step %d, %d ranks, %d files, %d tensors, %d bytes, every checksum matches\n",
		rep.Dir, rep.Step, rep.Ranks, rep.Files, rep.Tensors, rep.Bytes)
	return nil
}

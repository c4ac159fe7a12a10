package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"sort"

	"github.com/zinfio/zinf/checkpoint"
	"github.com/zinfio/zinf/internal/ckptbench"
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

func (s *saveFlags) options(log *slog.Logger) (checkpoint.SaveOptions, error) {
	if s.stagingBytes <= 0 || s.stagingBytes > 1<<30 {
		return checkpoint.SaveOptions{}, fmt.Errorf("--staging-bytes %d is invalid (allowed: a multiple of 4096 up to 1GiB)", s.stagingBytes)
	}
	o := checkpoint.SaveOptions{StagingBytes: int(s.stagingBytes), StagingBuffers: s.buffers, Parallel: s.parallel, Logger: log}
	o.EnsureDefaults()
	if err := o.Validate(); err != nil {
		return o, err
	}
	return o, nil
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
	if size <= 0 {
		return fmt.Errorf("--size %d must be positive", size)
	}
	opts, err := sf.options(slog.New(slog.NewTextHandler(stderr, nil)))
	if err != nil {
		return err
	}
	res, err := ckptbench.SaveBench(ctx, dir, size, opts)
	if err != nil {
		return err
	}
	out := struct {
		Zinf  ckptbench.BenchResult  `json:"zinf"`
		Naive *ckptbench.BenchResult `json:"naive,omitempty"`
	}{Zinf: res}
	if naive {
		n, err := ckptbench.NaiveSaveBench(ctx, dir, size)
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
	fs.BoolVar(&asJSON, "json", false, "print one JSON object (progress still goes to stderr)")
	sf.register(fs)
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if o.Dir == "" {
		return errors.New("--path is required")
	}
	if o.Rounds < 1 {
		return fmt.Errorf("--rounds %d must be at least 1", o.Rounds)
	}
	var err error
	if o.Save, err = sf.options(slog.New(slog.NewTextHandler(stderr, nil))); err != nil {
		return err
	}
	if ioBlock < 0 || ioBlock > 1<<30 || o.Engine.QueueDepth < 0 || o.Engine.IntraOpParallelism < 0 {
		return fmt.Errorf("--io-block-size %d, --io-queue-depth %d, --io-parallel %d: none may be negative (0: the default), block size at most 1GiB",
			ioBlock, o.Engine.QueueDepth, o.Engine.IntraOpParallelism)
	}
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

package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/gomlx/compute"
	"golang.org/x/sys/unix"

	"github.com/zinfio/zinf/contrib/gomlx/generate"
	"github.com/zinfio/zinf/metrics/procstat"
	"github.com/zinfio/zinf/regfile"
)

// makeModel writes --model with random weights from --seed to a new
// safetensors file (--make-model).
func makeModel(ctx context.Context, o options, sp Spec, stdout io.Writer) error {
	backend, err := compute.NewWithConfig("go:ops_sequential")
	if err != nil {
		return err
	}
	vars, err := generate.ModelVars(backend, sp.Fn())
	if err != nil {
		return err
	}
	var params, bytes int64
	for _, v := range vars {
		params += int64(v.Numel())
		bytes += v.Shape.ByteSize()
	}
	fmt.Fprintf(stdout, "model: %s: %d tensors, %d parameters, %.2f GiB of weights\n", sp, len(vars), params, float64(bytes)/(1<<30))
	t0 := time.Now()
	size, err := generate.WriteRandomModel(ctx, backend, sp.Fn(), o.makeModel, o.seed)
	if err != nil {
		return fmt.Errorf("--make-model: %w", err)
	}
	d := time.Since(t0)
	fmt.Fprintf(stdout, "wrote %s: %d bytes (%.2f GiB) of random weights from seed %d in %.1f s (%.0f MB/s)\n",
		o.makeModel, size, float64(size)/(1<<30), o.seed, d.Seconds(), float64(size)/d.Seconds()/1e6)
	return nil
}

// runMapped generates with the weights in the --safetensors files mapped
// into memory (--mmap): the baseline zinf is measured against.
func runMapped(ctx context.Context, o options, sp Spec, fn generate.ModelFn, backend compute.Backend, advice generate.Advice, tok *tokenizer,
	prompts [][]int32, samp generate.Sampling, batch int, stdout io.Writer) (err error) {
	if o.verify {
		return errors.New("--verify checks generation through zinf; with --mmap, compare the tokens lines of a run without --mmap")
	}
	if o.batch == "auto" {
		return errors.New("--batch auto plans through zinf: give --batch N with --mmap")
	}
	files := strings.Split(o.safetensors, ",")
	g, err := generate.OpenMapped(ctx, backend, fn, generate.MappedOptions{Advice: advice}, files...)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, g.Close()) }()
	fmt.Fprintf(stdout, "model: %s; tokenizer %s; weights from %s (variable paths)\n", sp, tok.name, o.safetensors)
	fmt.Fprintf(stdout, "weights: %d tensors, %s mapped whole (mmap, madvise: %s) and paged by the kernel; each layer's tensors built from the mapping as it runs\n",
		len(g.Vars()), mib(g.WeightBytes()), advice)
	longest := 0
	for _, p := range prompts {
		longest = max(longest, len(p))
	}
	if batch == 0 || batch > len(prompts) {
		batch = len(prompts)
	}
	if _, _, err := generateAll(ctx, g, o, tok, prompts, samp, batch, longest, 0, stdout); err != nil {
		return err
	}
	processLine(stdout, 0, 0)
	return nil
}

// dropCache drops path's pages from the page cache (its own pages only:
// fdatasync, then posix_fadvise DONTNEED).
func dropCache(path string) error {
	f, _, err := regfile.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := unix.Fdatasync(int(f.Fd())); err != nil {
		return fmt.Errorf("fdatasync %s: %w", path, err)
	}
	if err := unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED); err != nil {
		return fmt.Errorf("posix_fadvise(DONTNEED) %s: %w", path, err)
	}
	return nil
}

// processLine prints what the process read from disk (/proc/self/io) and
// its peak resident set (VmHWM), against bound (pool + KV cache) + prefill
// (what the plan allowed the longest prompt's prefill) + 512 MiB when
// bound > 0.
func processLine(stdout io.Writer, bound, prefill int64) {
	read, _, okR := procstat.IO()
	hwm, okH := procstat.Status("VmHWM")
	if !okR || !okH {
		fmt.Fprintln(stdout, "process: /proc/self/io or /proc/self/status unreadable")
		return
	}
	anon, _ := procstat.Status("RssAnon")
	file, _ := procstat.Status("RssFile")
	fmt.Fprintf(stdout, "process: read from disk %s (/proc/self/io read_bytes), peak RSS %s (VmHWM; at exit anonymous %s, file-backed %s)",
		mib(read), mib(hwm), mib(anon), mib(file))
	if bound > 0 {
		b := bound + prefill + 512<<20
		verdict := "within"
		if hwm > b {
			verdict = "OVER"
		}
		fmt.Fprintf(stdout, "; bound pool + KV cache + prefill %s + 512 MiB = %s: %s", mib(prefill), mib(b), verdict)
	}
	fmt.Fprintln(stdout)
}

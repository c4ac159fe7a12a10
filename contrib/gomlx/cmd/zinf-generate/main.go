// Command zinf-generate generates text from GoMLX's zoo transformer with
// its weights on NVMe, streamed layer by layer through zinf's pinned pool
// (contrib/gomlx/generate). It lives in the GoMLX adapter's module because
// zinf's core does not depend on GoMLX.
//
//	zinf-generate --checkpoint /ckpt --model vocab=256,dim=256,layers=8,heads=8 \
//	    --prompt "In the beginning" --max-new-tokens 64 --batch auto --verify
//
// Without --checkpoint or --safetensors it generates from a freshly
// initialized model (--seed). Text is byte-level: a prompt's bytes are its
// tokens (the vocabulary must hold 256), generated ids below 256 print as
// bytes.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"math"
	"os"
	"os/signal"
	"path/filepath"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/gomlx/compute"
	"github.com/gomlx/compute/dtypes"
	_ "github.com/gomlx/compute/gobackend" // the pure-Go backend
	"github.com/gomlx/gomlx/ml/layers/activation"
	"github.com/gomlx/gomlx/ml/model"
	"github.com/gomlx/gomlx/ml/zoo/transformer"
	"github.com/gomlx/gomlx/ml/zoo/transformer/generate/sample"

	tiktoken "github.com/tiktoken-go/tokenizer"

	"github.com/zinfio/zinf/config"
	"github.com/zinfio/zinf/contrib/gomlx/generate"
	"github.com/zinfio/zinf/metrics"
	"github.com/zinfio/zinf/plan"
	"github.com/zinfio/zinf/regfile"
	"github.com/zinfio/zinf/swapper"
	"github.com/zinfio/zinf/trace"
)

func main() { os.Exit(runMain(os.Args[1:], os.Stdout, os.Stderr)) }

// runMain runs the command and returns its exit status: 0, 1 for a
// failure, 2 for -h, and for a run that SIGINT or SIGTERM cut short
// 128 + the signal's number (130, 143), as cmd/zinf and a shell do,
// whatever error the cancellation surfaced as.
func runMain(args []string, stdout, stderr io.Writer) int {
	ctx, stop := signalContext(stderr)
	defer stop()
	err := run(ctx, args, stdout, stderr)
	if err == nil {
		return 0
	}
	var se signalError
	if errors.As(context.Cause(ctx), &se) {
		fmt.Fprintf(stderr, "zinf-generate: interrupted by %v\n", se.sig)
		return 128 + int(se.sig)
	}
	fmt.Fprintln(stderr, "zinf-generate:", err)
	if errors.Is(err, flag.ErrHelp) {
		return 2
	}
	return 1
}

// signalError is the cause of a context cancelled by a signal.
type signalError struct{ sig syscall.Signal }

func (e signalError) Error() string { return "interrupted by " + e.sig.String() }

// interruptGrace is how long a run has to return on its own (closing the
// runtime, which removes its swap files) after SIGINT or SIGTERM cancelled
// its context. Past it, or at a second signal, the process exits with
// 128 + the signal's number: a wait no context reaches cannot keep it
// alive, and what it leaves is what a crash leaves, which the next run
// on the directory sweeps.
const interruptGrace = 5 * time.Second

// signalContext returns a context cancelled, with a signalError as its
// cause, on SIGINT or SIGTERM; stop releases the signals.
func signalContext(stderr io.Writer) (context.Context, func()) {
	ctx, cancel := context.WithCancelCause(context.Background())
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	done := make(chan struct{})
	go func() {
		sig := syscall.SIGINT
		select {
		case s := <-sigs:
			if ss, ok := s.(syscall.Signal); ok {
				sig = ss
			}
			cancel(signalError{sig})
		case <-done:
			return
		}
		timer := time.NewTimer(interruptGrace)
		defer timer.Stop()
		why := ""
		select {
		case <-sigs:
			why = "again"
		case <-timer.C:
			why = fmt.Sprintf("and still running %v later", interruptGrace)
		case <-done:
			return
		}
		fmt.Fprintf(stderr, "zinf-generate: interrupted by %v %s; exiting now\n", sig, why)
		os.Exit(128 + int(sig))
	}()
	return ctx, func() {
		signal.Stop(sigs)
		close(done)
		cancel(nil)
	}
}

// Spec is the zoo transformer's hyperparameters (--model).
type Spec struct {
	Vocab, Dim, Layers, Heads, KVHeads, HeadDim, FFN int
	Arch                                             string // standard | gemma
	DType                                            dtypes.DType
	RoPE                                             float64
	Scope                                            string // "" for the Store's root scope
	Norm, FinalNorm, Act                             string
	Bias                                             bool
}

func defaultSpec() Spec {
	return Spec{Vocab: 256, Dim: 256, Layers: 8, Heads: 8, KVHeads: 4, FFN: 1024, Arch: "standard", DType: dtypes.Float32, RoPE: 10000, Scope: "transformer",
		Norm: "rms", FinalNorm: "rms", Act: "silu"}
}

// parseSpec reads "vocab=256,dim=256,layers=8,heads=8,kv-heads=4,head-dim=32,
// ffn=1024,arch=standard,dtype=fp32,rope=10000,scope=transformer".
func parseSpec(s string) (Spec, error) {
	sp := defaultSpec()
	var errs []error
	for _, kv := range strings.Split(s, ",") {
		if kv == "" {
			continue
		}
		k, v, ok := strings.Cut(kv, "=")
		if !ok {
			errs = append(errs, fmt.Errorf("--model: %q is not key=value", kv))
			continue
		}
		num := func(dst *int, lo, hi int) {
			n, err := strconv.Atoi(v)
			if err != nil || n < lo || n > hi {
				errs = append(errs, fmt.Errorf("--model: %s=%q (allowed: %d..%d)", k, v, lo, hi))
				return
			}
			*dst = n
		}
		switch k {
		case "vocab":
			num(&sp.Vocab, 1, 1<<22)
		case "dim":
			num(&sp.Dim, 1, 1<<16)
		case "layers":
			num(&sp.Layers, 1, 4096)
		case "heads":
			num(&sp.Heads, 1, 1024)
		case "kv-heads":
			num(&sp.KVHeads, 0, 1024)
		case "head-dim":
			num(&sp.HeadDim, 1, 4096)
		case "ffn":
			num(&sp.FFN, 1, 1<<20)
		case "arch":
			if v != "standard" && v != "gemma" {
				errs = append(errs, fmt.Errorf("--model: arch=%q (allowed: standard, gemma)", v))
			}
			sp.Arch = v
		case "dtype":
			switch v {
			case "fp32", "float32":
				sp.DType = dtypes.Float32
			case "bf16", "bfloat16":
				sp.DType = dtypes.BFloat16
			default:
				errs = append(errs, fmt.Errorf("--model: dtype=%q (allowed: fp32, bf16)", v))
			}
		case "rope":
			f, err := strconv.ParseFloat(v, 64)
			if err != nil || f <= 0 {
				errs = append(errs, fmt.Errorf("--model: rope=%q (allowed: a base frequency > 0)", v))
			}
			sp.RoPE = f
		case "scope":
			if strings.ContainsAny(v, "/ ") {
				errs = append(errs, fmt.Errorf("--model: scope=%q (allowed: a scope name, e.g. transformer, or empty for the root)", v))
			}
			sp.Scope = v
		case "norm", "final-norm":
			if v != "rms" && v != "layer" && v != "none" {
				errs = append(errs, fmt.Errorf("--model: %s=%q (allowed: rms, layer, none)", k, v))
			}
			if k == "norm" {
				sp.Norm = v
			} else {
				sp.FinalNorm = v
			}
		case "act":
			if _, alias := activation.Aliases[v]; !alias {
				if _, err := activation.TypeString(v); err != nil || v == "" {
					errs = append(errs, fmt.Errorf("--model: act=%q (allowed: GoMLX activation names: silu, gelu, relu, ...)", v))
				}
			}
			sp.Act = v
		case "bias":
			b, err := strconv.ParseBool(v)
			if err != nil {
				errs = append(errs, fmt.Errorf("--model: bias=%q (allowed: true, false)", v))
			}
			sp.Bias = b
		default:
			errs = append(errs, fmt.Errorf("--model: unknown key %q (allowed: vocab, dim, layers, heads, kv-heads, head-dim, ffn, arch, dtype, rope, scope, norm, final-norm, act, bias)", k))
		}
	}
	if sp.HeadDim == 0 && sp.Heads > 0 {
		sp.HeadDim = max(1, sp.Dim/sp.Heads)
	}
	if sp.KVHeads > 0 && sp.Heads%sp.KVHeads != 0 {
		errs = append(errs, fmt.Errorf("--model: heads=%d is not a multiple of kv-heads=%d", sp.Heads, sp.KVHeads))
	}
	return sp, errors.Join(errs...)
}

// Fn builds the model the spec describes.
func (sp Spec) Fn() generate.ModelFn {
	return func(root *model.Scope) *transformer.Model {
		scope := root
		if sp.Scope != "" {
			scope = root.In("%s", sp.Scope)
		}
		m := transformer.New(scope).WithVocabSize(sp.Vocab).WithEmbedDim(sp.Dim).WithNumLayers(sp.Layers).
			WithNumHeads(sp.Heads).WithNumKVHeads(sp.KVHeads).WithHeadDim(sp.HeadDim).WithFFNDim(sp.FFN).WithRoPE(sp.RoPE).
			WithNormalization(sp.Norm).WithFinalNormalization(sp.FinalNorm).WithBias(sp.Bias).WithDType(sp.DType).
			WithActivation(activation.FromName(sp.Act))
		if sp.Arch == "gemma" {
			return m.WithArchitecture(transformer.ArchitectureGemma).WithTransposedWeights(true)
		}
		return m
	}
}

func (sp Spec) String() string {
	kv := sp.KVHeads
	if kv == 0 {
		kv = sp.Heads
	}
	return fmt.Sprintf("zoo transformer (%s): %d layers, dim %d, %d heads (%d kv) x %d, ffn %d, vocab %d, %s", sp.Arch, sp.Layers, sp.Dim, sp.Heads, kv, sp.HeadDim, sp.FFN, sp.Vocab, sp.DType)
}

type options struct {
	cfgPath, dir, checkpoint, safetensors, modelSpec string
	modelJSON, tokenizer                             string
	prompts                                          []string
	promptsFile                                      string
	maxNew                                           int
	batch                                            string
	strategy                                         string
	temperature, topP                                float64
	topK                                             int
	seed                                             int64
	eos, stop                                        string
	pool, maxInCPU                                   int64
	verify, quiet                                    bool
	traceFile, metricsAddr                           string
	progress                                         bool
	makeModel, names, mmap, computeDType             string
	cpuProfile                                       string
	plan, inPlaceOnly, dropCache                     bool
	pieceBytes                                       int64
	decoder                                          string
	prefillBytes                                     int64
}

type promptsFlag struct{ p *[]string }

func (f promptsFlag) String() string     { return "" }
func (f promptsFlag) Set(s string) error { *f.p = append(*f.p, s); return nil }

type sizeFlag struct{ p *int64 }

func (f sizeFlag) String() string { return "" }
func (f sizeFlag) Set(s string) error {
	n, err := config.ParseSize(s)
	if err != nil {
		return err
	}
	*f.p = int64(n)
	return nil
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) (err error) {
	fs := flag.NewFlagSet("zinf-generate", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var o options
	fs.StringVar(&o.cfgPath, "config", "", "config file (default: the embedded one, weights on NVMe in --dir, no max_in_cpu cache)")
	fs.StringVar(&o.dir, "dir", "", "swap directory when the config names none (default: the system's temporary directory; removed at exit)")
	fs.StringVar(&o.checkpoint, "checkpoint", "", "a zinf checkpoint directory (or a root of step-NNNNNN checkpoints: the newest) holding the model's parameters")
	fs.StringVar(&o.safetensors, "safetensors", "", "Hugging Face safetensors file(s), comma-separated, in Gemma layout (--model arch=gemma)")
	fs.StringVar(&o.modelSpec, "model", "", "the model: vocab=N,dim=N,layers=N,heads=N,kv-heads=N,head-dim=N,ffn=N,arch=standard|gemma,dtype=fp32|bf16,rope=F,scope=NAME (default vocab=256,dim=256,layers=8,heads=8,kv-heads=4,ffn=1024)")
	fs.StringVar(&o.modelJSON, "model-json", "", "the model as make demo-llm describes it (model.json: hyperparameters, tokenizer, checkpoint); default: DIR/model.json of --checkpoint DIR when there")
	fs.StringVar(&o.tokenizer, "tokenizer", "", "bytes, cl100k_base or o200k_base (default: model.json's, else bytes)")
	fs.Var(promptsFlag{&o.prompts}, "prompt", "a prompt (repeat for a batch)")
	fs.StringVar(&o.promptsFile, "prompts-file", "", "a file of prompts, one per line")
	fs.IntVar(&o.maxNew, "max-new-tokens", 32, "tokens to generate per prompt")
	fs.StringVar(&o.batch, "batch", "0", "sequences per batch: N, 0 for every prompt at once, or auto (the largest zinf.kv_cache allows, with the predicted tokens/s)")
	fs.StringVar(&o.strategy, "strategy", "greedy", "sampling: greedy, temperature, top_k, top_p")
	fs.Float64Var(&o.temperature, "temperature", 1, "sampling temperature (> 0)")
	fs.IntVar(&o.topK, "top-k", 50, "top-k's k")
	fs.Float64Var(&o.topP, "top-p", 0.9, "top-p's p (0 < p <= 1)")
	fs.Int64Var(&o.seed, "seed", 1, "sampling seed, and the fresh model's initialization seed")
	fs.StringVar(&o.eos, "eos", "", "EOS token ids, comma-separated (a sequence ends at one)")
	fs.StringVar(&o.stop, "stop", "", "stop token ids, comma-separated")
	fs.Var(sizeFlag{&o.pool}, "pool", "pinned pool (zinf.tiers.cpu_pinned_bytes), e.g. 8MiB; default: the config's")
	o.maxInCPU = -1
	fs.Var(sizeFlag{&o.maxInCPU}, "max-in-cpu", "weights kept in the pinned pool for good, spread over the layers, e.g. 16GiB (offload_param.max_in_cpu, given here in bytes): read once, by no decoding pass; the pool must hold them beside its swap buffers (a cache cut to fit is said); default: the config's (the embedded one: 0, every weight streamed every pass)")
	fs.BoolVar(&o.verify, "verify", false, "also generate greedily with GoMLX's generator, the whole model in memory, and compare the tokens")
	fs.BoolVar(&o.progress, "progress", true, "a line per decoding step")
	fs.StringVar(&o.traceFile, "trace", "", "write the runtime's timeline (Chrome trace-event JSON, for Perfetto) to this new file")
	fs.StringVar(&o.metricsAddr, "metrics-addr", "", "serve Prometheus metrics at this address (e.g. 127.0.0.1:9400) while generating")
	fs.StringVar(&o.makeModel, "make-model", "", "write the --model with random weights from --seed to this new safetensors file (streamed, a chunk at a time) and exit")
	fs.StringVar(&o.names, "names", "hf", "tensor names in --safetensors: hf (Hugging Face's, --model arch=gemma) or vars (the model's variable paths, as --make-model writes them)")
	fs.StringVar(&o.mmap, "mmap", "", "plain, sequential or willneed: generate from the --safetensors file mapped into memory and paged by the kernel (madvise per the value), not through zinf (the baseline; --names vars)")
	fs.BoolVar(&o.plan, "plan", true, "plan the batch (runs two short generations to measure compute); false: --batch N as given, no prediction")
	fs.BoolVar(&o.inPlaceOnly, "in-place-only", false, "fail rather than copy a weight that cannot be read in place into the swap files")
	fs.BoolVar(&o.dropCache, "drop-cache", false, "drop the --safetensors files from the page cache first (fdatasync, then posix_fadvise DONTNEED: no other file's pages)")
	fs.StringVar(&o.computeDType, "compute-dtype", "", "the dtype the model computes in: fp32 runs a bf16 model in float32, each weight widened as its layer is read (the weights stay bf16 on disk and in the pinned pool; the pure-Go backend's float32 matmul is the fast one, with SIMD kernels when built with GOEXPERIMENT=simd); default: the model's dtype")
	fs.StringVar(&o.cpuProfile, "cpuprofile", "", "write a CPU profile (go tool pprof) of the generation to this new file")
	fs.Var(sizeFlag{&o.prefillBytes}, "prefill-bytes", "memory a prompt's prefill may take beyond the pinned pool and the KV cache (generate.Options.PrefillBytes), e.g. 1GiB: a longer prompt is refused with the figure; default 256MiB")
	fs.Int64Var(&o.pieceBytes, "piece-bytes", 0, "zinf.Options.PieceBytes: tensors larger move in pieces (0: the config's, else 4 MiB; -1: every tensor moves whole and is prefetched)")
	fs.StringVar(&o.decoder, "decoder", "auto", "the forward pass: auto (the native decoder where it covers the model and the generation: greedy, KV cache in memory; GoMLX's graphs otherwise, said in a line), native or gomlx")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if _, err := generate.ParseDecoder(o.decoder); err != nil {
		return fmt.Errorf("--decoder %q (allowed: auto, native, gomlx)", o.decoder)
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	sp, err := parseSpec(o.modelSpec)
	if err != nil {
		return err
	}
	if o.cpuProfile != "" {
		f, err := os.OpenFile(o.cpuProfile, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
		if err != nil {
			return fmt.Errorf("--cpuprofile: %w", err)
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			f.Close()
			return fmt.Errorf("--cpuprofile: %w", err)
		}
		defer func() {
			pprof.StopCPUProfile()
			if cerr := f.Close(); err == nil && cerr != nil {
				err = fmt.Errorf("--cpuprofile: %w", cerr)
			}
		}()
	}
	if o.makeModel != "" {
		return makeModel(ctx, o, sp, stdout)
	}
	if o.names != "hf" && o.names != "vars" {
		return fmt.Errorf("--names %q (allowed: hf, vars)", o.names)
	}
	var advice generate.Advice
	if o.mmap != "" {
		if advice, err = generate.ParseAdvice(o.mmap); err != nil {
			return fmt.Errorf("--mmap: %w", err)
		}
		if o.safetensors == "" || o.names != "vars" {
			return errors.New("--mmap maps a --safetensors file holding the model's variable paths: give --safetensors FILE --names vars")
		}
	}
	if o.modelJSON == "" && o.checkpoint != "" {
		if _, err := os.Stat(filepath.Join(o.checkpoint, "model.json")); err == nil {
			o.modelJSON = filepath.Join(o.checkpoint, "model.json")
		}
	}
	if o.modelJSON != "" {
		if o.modelSpec != "" {
			return errors.New("--model and --model-json (or a model.json beside --checkpoint): give one")
		}
		var tokName, ckpt string
		if sp, tokName, ckpt, err = loadModelJSON(o.modelJSON); err != nil {
			return err
		}
		if o.tokenizer == "" {
			o.tokenizer = tokName
		}
		if ckpt != "" && (o.checkpoint == "" || filepath.Clean(o.checkpoint) == filepath.Dir(filepath.Clean(o.modelJSON))) {
			o.checkpoint = ckpt
		}
	}
	tok, err := newTokenizer(o.tokenizer, sp.Vocab)
	if err != nil {
		return err
	}
	prompts, err := readPrompts(o, tok)
	if err != nil {
		return err
	}
	samp, err := sampling(o)
	if err != nil {
		return err
	}
	batch, auto := 0, o.batch == "auto"
	if !auto {
		if batch, err = strconv.Atoi(o.batch); err != nil || batch < 0 {
			return fmt.Errorf("--batch %q (allowed: a count >= 0, or auto)", o.batch)
		}
	}
	if o.checkpoint != "" && o.safetensors != "" {
		return errors.New("--checkpoint and --safetensors: give one")
	}
	if o.pool < 0 {
		return fmt.Errorf("--pool %d (allowed: > 0)", o.pool)
	}
	if o.decoder == generate.DecoderNative && o.mmap != "" {
		return errors.New("--decoder native reads the weights in zinf's pinned buffers: not with --mmap (give --decoder auto or gomlx)")
	}
	if o.maxInCPU >= 0 && o.mmap != "" {
		return errors.New("--max-in-cpu keeps weights in zinf's pinned pool: not with --mmap, which has none")
	}
	if o.pieceBytes < -1 {
		return fmt.Errorf("--piece-bytes %d (allowed: -1, 0 or a size in bytes)", o.pieceBytes)
	}
	if o.dropCache {
		if o.safetensors == "" {
			return errors.New("--drop-cache drops the --safetensors files' pages: give --safetensors")
		}
		for _, f := range strings.Split(o.safetensors, ",") {
			if err := dropCache(f); err != nil {
				return fmt.Errorf("--drop-cache: %w", err)
			}
		}
	}
	cfg, cleanup, err := loadConfig(o)
	if err != nil {
		return err
	}
	defer cleanup()
	// fnStore is the model as stored (a fresh model is initialized in its
	// dtype), fn as computed.
	fnStore, fn := sp.Fn(), sp.Fn()
	computeDType := sp.DType
	switch strings.ToLower(o.computeDType) {
	case "":
	case "fp32", "float32":
		computeDType = dtypes.Float32
	case "bf16", "bfloat16":
		computeDType = dtypes.BFloat16
	default:
		return fmt.Errorf("--compute-dtype %q (allowed: fp32, bf16, or empty for the model's %s)", o.computeDType, sp.DType)
	}
	switch {
	case computeDType == sp.DType:
	case computeDType == dtypes.Float32:
		c := sp
		c.DType = dtypes.Float32
		fn = c.Fn()
	default:
		return fmt.Errorf("--compute-dtype %s for a %s model: weights are widened, never narrowed (allowed: fp32, or the model's dtype)", computeDType, sp.DType)
	}
	if sp.DType == dtypes.BFloat16 {
		cfg.BF16 = true // the weights are stored in bf16
	}
	if o.maxInCPU >= 0 {
		cfg.ZeroOptimization.OffloadParam.MaxInCPU = o.maxInCPU / int64(plan.ParamDType(cfg).Size()) // elements, as DeepSpeed counts them
	}
	if computeDType == dtypes.BFloat16 {
		// compute v0.1.2's fused dense has no bf16 kernel.
		os.Setenv("GOMLX_FUSION", "false")
	}
	backend, err := compute.NewWithConfig("go:ops_sequential")
	if err != nil {
		return err
	}
	weights, source, closeW, err := openWeights(backend, fnStore, o, sp)
	if err != nil {
		return err
	}
	defer closeW()

	if computeDType != sp.DType {
		fmt.Fprintf(stdout, "computed in %s: each weight widened from %s as its layer is read (--compute-dtype)\n", computeDType, sp.DType)
	}
	if o.mmap != "" {
		return runMapped(ctx, o, sp, fn, backend, advice, tok, prompts, samp, batch, stdout)
	}
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	gopts := generate.Options{Logger: log, PieceBytes: o.pieceBytes, InPlaceOnly: o.inPlaceOnly, Decoder: o.decoder, PrefillBytes: o.prefillBytes}
	var tw *trace.ChromeWriter
	if o.traceFile != "" {
		f, err := os.OpenFile(o.traceFile, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
		if err != nil {
			return fmt.Errorf("--trace: %w", err)
		}
		tw = trace.NewChromeWriter(f, trace.ChromeOptions{})
		gopts.Trace = tw
		defer func() {
			err = errors.Join(err, tw.Close(), f.Close())
			fmt.Fprintf(stderr, "trace: %d events in %s\n", tw.Events(), o.traceFile)
		}()
	}
	g, err := generate.Open(ctx, backend, cfg, fn, weights, gopts)
	if err != nil {
		return wrongModel(err, sp)
	}
	defer func() { err = errors.Join(err, g.Close()) }()
	warnNonFinite(weights, stderr)
	if o.metricsAddr != "" {
		c := metrics.New(g.Runtime())
		srv, err := metrics.Serve(o.metricsAddr, metrics.NewRegistry(c))
		if err != nil {
			return fmt.Errorf("--metrics-addr %s: %w", o.metricsAddr, err)
		}
		defer func() {
			c.Set()
			srv.Close(context.Background())
		}()
		fmt.Fprintf(stderr, "metrics: serving http://%s/metrics\n", srv.Addr())
	}
	wb := g.WeightBytes()
	pool := g.Runtime().Metrics().PinnedBytes
	fmt.Fprintf(stdout, "model: %s; tokenizer %s; %s\n", sp, tok.name, source)
	fmt.Fprintf(stdout, "decoder: %s\n", g.Decoder())
	nc, cb := g.CachedBytes()
	fmt.Fprintf(stdout, "weights: %d tensors, %s on NVMe (%s), streamed layer by layer through a %s pinned pool (weights / pool = %.1fx), prefetch %d layers\n",
		len(g.Vars())-nc, mib(wb), strings.Join(cfg.NVMePaths(), ", "), config.Size(pool), float64(wb+cb)/float64(pool), g.Runtime().Placement().PrefetchDepth)
	if want := cfg.ZeroOptimization.OffloadParam.MaxInCPU * int64(plan.ParamDType(cfg).Size()); nc > 0 || want > 0 {
		fmt.Fprintf(stdout, "  %d tensors (%s) held in the pinned pool for good, spread over the layers: read once, by no decoding pass (max_in_cpu %s; the pool spares %s for it)\n",
			nc, mib(cb), mib(want), mib(g.Runtime().Reservations().ParamCacheBytes))
	}
	if n, b := g.InPlace(); n > 0 {
		fmt.Fprintf(stdout, "  %d tensors (%s) read in place from their files by O_DIRECT, %d copied into the swap files\n", n, config.Size(b), len(g.Vars())-n)
	}
	longest := 0
	for _, p := range prompts {
		longest = max(longest, len(p))
	}
	var predicted float64
	if auto {
		p, err := g.PlanBatch(ctx, longest, o.maxNew, len(prompts))
		if err != nil {
			return err
		}
		batch, predicted = p.Batch, p.TokensPerSecond
		fmt.Fprintf(stdout, "plan: %s\n  %s\n", p, p.KV)
	}
	if batch == 0 || batch > len(prompts) {
		batch = len(prompts)
	}
	if auto && !o.plan {
		return errors.New("--batch auto plans the batch: not with --plan=false")
	}
	if !auto && o.plan {
		p, err := g.PlanBatch(ctx, longest, o.maxNew, batch)
		if err != nil {
			return err
		}
		if p.Batch < batch {
			return fmt.Errorf("--batch %d: %s allows at most %d sequences (%s)", batch, p.Limit, p.Batch, p.KV)
		}
		predicted = p.TokensPerSecond
		fmt.Fprintf(stdout, "plan: %s\n  %s\n", p, p.KV)
	}
	all, kvBytes, err := generateAll(ctx, g, o, tok, prompts, samp, batch, longest, predicted, stdout)
	if err != nil {
		return err
	}
	// The bound counts what the plan allowed the prefill beside the pool
	// and the KV cache (its activations, one chunk, its garbage).
	processLine(stdout, pool+kvBytes, g.PrefillBytes(min(batch, len(prompts)), longest))
	if !o.verify {
		return nil
	}
	greedy := samp
	greedy.Strategy = sample.StrategyGreedy
	mine := all
	if samp.Strategy != sample.StrategyGreedy {
		mine = nil
		for lo := 0; lo < len(prompts); lo += batch {
			res, err := g.Generate(ctx, prompts[lo:min(lo+batch, len(prompts))], greedy, nil)
			if err != nil {
				return err
			}
			mine = append(mine, res.Tokens...)
		}
	}
	vw, _, closeV, err := openWeights(backend, fnStore, o, sp)
	if err != nil {
		return err
	}
	defer closeV()
	eq := true
	// GoMLX's generator takes prompts of one length: one batch per length.
	byLen := map[int][]int{}
	for i, p := range prompts {
		byLen[len(p)] = append(byLen[len(p)], i)
	}
	for _, idx := range byLen {
		ps := make([][]int32, len(idx))
		for j, i := range idx {
			ps[j] = prompts[i]
		}
		ref, err := generate.InMemory(ctx, backend, fn, vw, ps, greedy)
		if err != nil {
			return err
		}
		for j, i := range idx {
			if !slices.Equal(ref[j], mine[i]) {
				eq = false
				fmt.Fprintf(stdout, "prompt %d: through zinf %v, in memory %v\n", i, mine[i], ref[j])
			}
		}
	}
	ties := false
	if strings.HasPrefix(g.Decoder(), generate.DecoderNative) {
		// The native decoder's logits against GoMLX's forward pass on
		// the same tokens: within the tolerance, and where a token
		// parts from GoMLX's choice, both logits.
		lc, err := generate.CheckNativeLogits(ctx, backend, fn, vw, prompts, mine)
		if err != nil {
			return err
		}
		verdict := "within"
		if !lc.Within() {
			verdict = "OUTSIDE"
		}
		fmt.Fprintf(stdout, "native logits against GoMLX's forward pass on the same tokens: %d positions, max error %.3g of max(1, max |logit|) (sequence %d, token %d; tolerance %g): %s\n",
			lc.Positions, lc.MaxError, lc.MaxErrSeq, lc.MaxStep, generate.NativeLogitTolerance, verdict)
		ties = !eq
		for _, f := range lc.Flips {
			fmt.Fprintf(stdout, "  first flip: %s\n", f)
			ties = ties && f.NearTie
		}
		if !lc.Within() {
			return errors.New("the native decoder's logits are outside the tolerance of GoMLX's")
		}
		ties = ties && len(lc.Flips) > 0
	}
	if !eq && ties {
		fmt.Fprintf(stdout, "greedy tokens equal in-memory generation: false, parting first at near ties of the logits (above)\n")
		return nil
	}
	fmt.Fprintf(stdout, "greedy tokens equal in-memory generation: %v\n", eq)
	if !eq {
		return errors.New("greedy tokens differ from in-memory generation")
	}
	return nil
}

// wrongModel says, of weights that are not the model's, which model was
// asked for.
func wrongModel(err error, sp Spec) error {
	if errors.Is(err, generate.ErrWrongModel) {
		return fmt.Errorf("%w\n  the model asked for (--model, or model.json): %s, bias=%t, norm=%s, act=%s", err, sp, sp.Bias, sp.Norm, sp.Act)
	}
	return err
}

// warnNonFinite warns, a line per tensor, of NaN or infinite values in
// the weights converted at load (those read in place are not scanned: a
// pass over weights larger than memory, for a warning).
func warnNonFinite(w generate.Weights, stderr io.Writer) {
	nf, ok := w.(interface{ NonFinite() map[string]int })
	if !ok {
		return
	}
	counts := nf.NonFinite()
	for _, name := range slices.Sorted(maps.Keys(counts)) {
		fmt.Fprintf(stderr, "zinf-generate: warning: the weights' %q hold %d NaN or infinite values: generation computes with them\n", name, counts[name])
	}
}

func readPrompts(o options, tok *tokenizer) ([][]int32, error) {
	texts := slices.Clone(o.prompts)
	if o.promptsFile != "" {
		f, _, err := regfile.Open(o.promptsFile)
		if err != nil {
			return nil, fmt.Errorf("--prompts-file: %w", err)
		}
		defer f.Close()
		sc := bufio.NewScanner(f)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			if l := sc.Text(); strings.TrimSpace(l) != "" {
				texts = append(texts, l)
			}
		}
		if err := sc.Err(); err != nil {
			return nil, fmt.Errorf("--prompts-file %s: %w", o.promptsFile, err)
		}
	}
	if len(texts) == 0 {
		return nil, errors.New("no prompt: give --prompt or --prompts-file")
	}
	var out [][]int32
	for i, t := range texts {
		if t == "" {
			return nil, fmt.Errorf("prompt %d is empty", i)
		}
		p, err := tok.encode(t)
		if err != nil {
			return nil, fmt.Errorf("prompt %d: %w", i, err)
		}
		if len(p) == 0 {
			return nil, fmt.Errorf("prompt %d has no tokens", i)
		}
		out = append(out, p)
	}
	return out, nil
}

// tokenizer turns text into token ids and back: bytes, or a tiktoken BPE.
type tokenizer struct {
	name  string
	codec tiktoken.Codec
}

func newTokenizer(name string, vocab int) (*tokenizer, error) {
	switch name {
	case "", "bytes":
		if vocab < 256 {
			return nil, fmt.Errorf("--model: vocab=%d: byte-level text needs at least 256 (or give --tokenizer)", vocab)
		}
		return &tokenizer{name: "bytes"}, nil
	case string(tiktoken.Cl100kBase), string(tiktoken.O200kBase):
		c, err := tiktoken.Get(tiktoken.Encoding(name))
		if err != nil {
			return nil, fmt.Errorf("--tokenizer %s: %w", name, err)
		}
		return &tokenizer{name: name, codec: c}, nil
	}
	return nil, fmt.Errorf("--tokenizer %q (allowed: bytes, cl100k_base, o200k_base)", name)
}

func (t *tokenizer) encode(s string) ([]int32, error) {
	if t.codec == nil {
		p := make([]int32, len(s))
		for j := range len(s) {
			p[j] = int32(s[j])
		}
		return p, nil
	}
	ids, _, err := t.codec.Encode(s)
	if err != nil {
		return nil, err
	}
	out := make([]int32, len(ids))
	for i, id := range ids {
		out[i] = int32(id)
	}
	return out, nil
}

func (t *tokenizer) decode(ts []int32) string {
	if t.codec != nil {
		ids := make([]uint, 0, len(ts))
		for _, x := range ts {
			if x >= 0 {
				ids = append(ids, uint(x))
			}
		}
		if s, err := t.codec.Decode(ids); err == nil {
			return s
		}
	}
	var sb strings.Builder
	for _, x := range ts {
		if x >= 0 && x < 256 {
			sb.WriteByte(byte(x))
		} else {
			fmt.Fprintf(&sb, "<%d>", x)
		}
	}
	return sb.String()
}

// modelJSON is make demo-llm's model.json.
type modelJSON struct {
	Scope      string  `json:"scope"`
	Tokenizer  string  `json:"tokenizer"`
	Vocab      int     `json:"vocab"`
	Dim        int     `json:"embed_dim"`
	Layers     int     `json:"num_layers"`
	Heads      int     `json:"num_heads"`
	KVHeads    int     `json:"num_kv_heads"`
	HeadDim    int     `json:"head_dim"`
	FFN        int     `json:"ffn_dim"`
	RoPE       float64 `json:"rope_base_freq"`
	Norm       string  `json:"normalization"`
	FinalNorm  string  `json:"final_normalization"`
	Activation string  `json:"activation"`
	Bias       *bool   `json:"use_bias"`
	DType      string  `json:"dtype"`
	Checkpoint string  `json:"checkpoint"`
}

// loadModelJSON reads a model.json: the zoo transformer's defaults (layer
// norms, GELU, biases) where it says nothing.
func loadModelJSON(path string) (sp Spec, tok, ckpt string, err error) {
	f, _, err := regfile.Open(path)
	if err != nil {
		return sp, "", "", fmt.Errorf("--model-json: %w", err)
	}
	defer f.Close()
	// Read no more than the bound (and a byte to see it passed), whatever
	// the file's size.
	b, err := io.ReadAll(io.LimitReader(f, 1<<20+1))
	if err != nil {
		return sp, "", "", fmt.Errorf("--model-json: %w", err)
	}
	if len(b) > 1<<20 {
		return sp, "", "", fmt.Errorf("--model-json %s: more than %d bytes (a model description is far smaller)", path, 1<<20)
	}
	var j modelJSON
	if err := json.Unmarshal(b, &j); err != nil {
		return sp, "", "", fmt.Errorf("--model-json %s: %w", path, err)
	}
	spec := fmt.Sprintf("vocab=%d,dim=%d,layers=%d,heads=%d,kv-heads=%d,head-dim=%d,ffn=%d,scope=%s,norm=%s,final-norm=%s,act=%s,bias=%t",
		j.Vocab, j.Dim, j.Layers, j.Heads, j.KVHeads, j.HeadDim, j.FFN, strings.Trim(j.Scope, "/"), or(j.Norm, "layer"), or(j.FinalNorm, "none"), or(j.Activation, "gelu"), j.Bias == nil || *j.Bias)
	if j.RoPE > 0 {
		spec += fmt.Sprintf(",rope=%g", j.RoPE)
	}
	if j.DType != "" {
		spec += ",dtype=" + strings.ToLower(j.DType)
	}
	if sp, err = parseSpec(spec); err != nil {
		return sp, "", "", fmt.Errorf("--model-json %s: %w", path, err)
	}
	if ckpt = j.Checkpoint; ckpt != "" && !filepath.IsAbs(ckpt) {
		ckpt = filepath.Join(filepath.Dir(path), ckpt)
	}
	return sp, j.Tokenizer, ckpt, nil
}

func or(s, def string) string {
	if s == "" || s == "/" {
		return def
	}
	return s
}

func ids(flagName, s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		n, err := strconv.Atoi(f)
		if err != nil || n < 0 {
			return nil, fmt.Errorf("%s: %q is not a token id (allowed: integers >= 0)", flagName, f)
		}
		out = append(out, n)
	}
	return out, nil
}

func sampling(o options) (generate.Sampling, error) {
	st, err := sample.StrategyString(o.strategy)
	if err != nil || st == sample.StrategyBeamSearch {
		return generate.Sampling{}, fmt.Errorf("--strategy %q (allowed: greedy, temperature, top_k, top_p)", o.strategy)
	}
	eos, err := ids("--eos", o.eos)
	if err != nil {
		return generate.Sampling{}, err
	}
	stop, err := ids("--stop", o.stop)
	if err != nil {
		return generate.Sampling{}, err
	}
	var errs []error
	// Written so that NaN, which every comparison fails, is refused too.
	if !(o.temperature > 0) || math.IsInf(o.temperature, 1) {
		errs = append(errs, fmt.Errorf("--temperature %g (allowed: a finite number > 0)", o.temperature))
	}
	if o.topK <= 0 {
		errs = append(errs, fmt.Errorf("--top-k %d (allowed: > 0)", o.topK))
	}
	if !(o.topP > 0 && o.topP <= 1) {
		errs = append(errs, fmt.Errorf("--top-p %g (allowed: 0 < p <= 1)", o.topP))
	}
	if o.maxNew <= 0 || o.maxNew > 1<<16 {
		errs = append(errs, fmt.Errorf("--max-new-tokens %d (allowed: 1..65536)", o.maxNew))
	}
	return generate.Sampling{Strategy: st, Temperature: o.temperature, TopK: o.topK, TopP: o.topP, Seed: o.seed, MaxNewTokens: o.maxNew, EOS: eos, Stop: stop}, errors.Join(errs...)
}

func loadConfig(o options) (*config.Config, func(), error) {
	var cfg *config.Config
	if o.cfgPath != "" {
		c, err := config.Load(o.cfgPath)
		if err != nil {
			return nil, nil, fmt.Errorf("--config: %w", err)
		}
		cfg = c
	} else {
		cfg = config.Default()
		cfg.ZeroOptimization.OffloadParam.MaxInCPU = 0 // stream every weight every pass
	}
	cleanup := func() {}
	if len(cfg.NVMePaths()) == 0 || cfg.ZeroOptimization.OffloadParam.NVMePath == "" && len(cfg.Zinf.NVMePaths) == 0 {
		dir := o.dir
		if dir == "" {
			// A locked run directory (as zinf's tools make theirs): the
			// directory a killed run left, swap stores and all, is removed
			// by the next run here, and one a live run holds is not.
			d, err := swapper.NewRunDir(os.TempDir(), "generate", nil)
			if err != nil {
				return nil, nil, err
			}
			dir = d.Path()
			cleanup = func() { d.Close() }
		}
		cfg.SetScratchDir(dir)
	}
	if o.pool > 0 {
		cfg.Zinf.Tiers.CPUPinnedBytes = config.Size(o.pool)
	}
	if err := cfg.Validate(); err != nil {
		cleanup()
		return nil, nil, err
	}
	return cfg, cleanup, nil
}

// openWeights opens the weights the flags name, or initializes a fresh
// model in memory.
func openWeights(backend compute.Backend, fn generate.ModelFn, o options, sp Spec) (generate.Weights, string, func(), error) {
	switch {
	case o.checkpoint != "":
		w, err := generate.CheckpointWeights(o.checkpoint)
		if err != nil {
			return nil, "", nil, fmt.Errorf("--checkpoint: %w", err)
		}
		return w, "weights from the zinf checkpoint " + w.Dir, func() { w.Close() }, nil
	case o.safetensors != "" && o.names == "vars":
		w, err := generate.SafetensorsWeights(nil, strings.Split(o.safetensors, ",")...)
		if err != nil {
			return nil, "", nil, fmt.Errorf("--safetensors: %w", err)
		}
		return w, "weights from " + o.safetensors + " (variable paths)", func() {}, nil
	case o.safetensors != "":
		if sp.Arch != "gemma" {
			return nil, "", nil, errors.New("--safetensors reads Hugging Face's layout: give --model arch=gemma,...")
		}
		w, err := generate.SafetensorsWeights(generate.HFNames, strings.Split(o.safetensors, ",")...)
		if err != nil {
			return nil, "", nil, fmt.Errorf("--safetensors: %w", err)
		}
		return w, "weights from " + o.safetensors, func() {}, nil
	}
	store, err := generate.InitStore(backend, fn, o.seed)
	if err != nil {
		return nil, "", nil, err
	}
	return generate.StoreWeights(store), fmt.Sprintf("a fresh model (no checkpoint; initialized from seed %d)", o.seed), func() { store.Finalize() }, nil
}

// mib writes a byte count as MiB with one decimal (13038848 -> "12.4 MiB"):
// config.Size writes a count that is no whole KiB in bytes.
func mib(b int64) string { return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20)) }

// generateAll generates for prompts in batches and prints each step, the
// texts, the tokens and the figures; it returns the tokens and the KV
// cache's memory (the largest of the batches').
func generateAll(ctx context.Context, g *generate.Generator, o options, tok *tokenizer, prompts [][]int32, samp generate.Sampling, batch, longest int, predicted float64, stdout io.Writer) (all [][]int32, kvBytes int64, err error) {
	var gen, steps int
	var stepTimes, waits []time.Duration // decoding steps in which every sequence generated
	var decode, prefill, iowait time.Duration
	var read int64
	var decodeReads []int64 // each decoding step's: the median is the steady step's (the first's first layer came with the prefill, the last prefetches nothing)
	for lo := 0; lo < len(prompts); lo += batch {
		chunk := prompts[lo:min(lo+batch, len(prompts))]
		total := longest + o.maxNew
		res, err := g.Generate(ctx, chunk, samp, func(s generate.StepInfo) {
			if s.Step > 0 && !slices.Contains(s.Tokens, -1) {
				stepTimes = append(stepTimes, s.Time)
				waits = append(waits, s.IOWait)
			}
			if s.Step > 0 {
				decodeReads = append(decodeReads, s.BytesRead)
			}
			if !o.progress {
				return
			}
			what := "decode"
			if s.Step == 0 {
				what = "prefill"
			}
			fmt.Fprintf(stdout, "step %3d %-7s position %4d/%d: %8.1f ms, io-wait %7.1f ms\n", s.Step, what, s.Position, total, float64(s.Time)/1e6, float64(s.IOWait)/1e6)
		})
		if err != nil {
			return nil, 0, err
		}
		kvBytes = max(kvBytes, res.KVCache.MemoryBytes+res.KVCache.PinnedBytes)
		all = append(all, res.Tokens...)
		gen += res.Generated()
		steps += res.Steps
		decode += res.Decode
		prefill += res.Prefill
		iowait += res.IOWait
		read += res.BytesRead
		for i, t := range res.Tokens {
			fmt.Fprintf(stdout, "[%d] %q -> %q\n", lo+i, tok.decode(chunk[i]), tok.decode(t))
		}
	}
	tps := 0.0
	if decode > 0 {
		tps = float64(gen-len(prompts)) / decode.Seconds()
	}
	readWhat := "NVMe read"
	if g.Runtime() == nil {
		readWhat = "copied from the mapping" // the disk's reads: the process line
	}
	fmt.Fprintf(stdout, "generated %d tokens for %d prompts in batches of %d: %d passes, prefill %.1f ms, io-wait %.1f ms, %s %s\n",
		gen, len(prompts), batch, steps, float64(prefill)/1e6, float64(iowait)/1e6, readWhat, mib(read))
	for i, t := range all {
		fmt.Fprintf(stdout, "tokens [%d]: %v\n", i, t)
	}
	if len(stepTimes) > 0 {
		slices.Sort(stepTimes)
		slices.Sort(waits)
		med, w := stepTimes[len(stepTimes)/2], waits[len(waits)/2]
		slices.Sort(decodeReads)
		fmt.Fprintf(stdout, "decoding step: median %.1f ms = waiting for weights %.1f ms (median) + compute %.1f ms; weights read a decoding step %s (median)\n",
			float64(med)/1e6, float64(w)/1e6, float64(med-w)/1e6, mib(decodeReads[len(decodeReads)/2]))
		pred := ""
		if predicted > 0 {
			pred = fmt.Sprintf("; predicted %.2f", predicted)
		}
		fmt.Fprintf(stdout, "tokens/s: %.3g at the median full decoding step (%.1f ms for %d sequences%s); %.3g over every decoding step, graph compilations included\n",
			float64(batch)/med.Seconds(), float64(med)/1e6, batch, pred, tps)
	}
	return all, kvBytes, nil
}

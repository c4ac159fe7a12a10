// Command bench-llamacpp runs zinf's native decoder and llama.cpp side by
// side on the same GGUF files (make bench-llamacpp): it writes one
// llama-architecture model of random weights (drawn from -seed) in each
// of -types with zinf's GGUF writer, checks that both systems continue a
// prompt with the same greedy tokens, then, over -rounds rounds in
// alternating order (llama.cpp first in even rounds, zinf first in odd
// ones), measures decoding tokens/s at batch 1 (llama-bench -p 0 -n N) and
// at batch 4 (llama-batched-bench -npp P -ntg N -npl 4; zinf-decode
// -batch 4 -prompt-len P), and prints per case the medians with min..max
// and the ratio zinf / llama.cpp. Then, past RAM, it writes one model
// whose weights are -past-ram-factor times the machine's memory (bf16 by
// default; llama-13B's widths with as many layers as that takes; skipped,
// saying so, where the disk lacks the room) and decodes it at batch 1 over
// -past-ram-rounds alternating rounds with llama.cpp (the file mapped, as
// llama.cpp maps it by default) and with zinf-decode -stream (the weights
// read in place with O_DIRECT through zinf's pinned pool, as many kept
// there for good as the memory allows), printing seconds a token, the
// ratio, zinf's floor by its plan (the streamed bytes at the planned NVMe
// bandwidth, or the step's compute) and its peak RSS against the pool, the
// KV cache and 512 MiB. -parts picks either half. Without a llama.cpp
// build at -llama-cpp it says so and exits 0.
package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"time"

	"github.com/zinfio/zinf/config"
	"github.com/zinfio/zinf/decoder"
	"github.com/zinfio/zinf/decoder/kernels"
	"github.com/zinfio/zinf/gguf"
)

// shapes are the model sizes -size names. 400m is the in-RAM
// case (about 400 M parameters); tiny proves the wiring in seconds.
var shapes = map[string]gguf.ModelShape{
	"tiny":  {Dim: 256, Layers: 4, Heads: 4, KVHeads: 2, HeadDim: 64, FFNDim: 768},
	"small": {Dim: 768, Layers: 12, Heads: 12, KVHeads: 12, HeadDim: 64, FFNDim: 2048},
	"400m":  {Dim: 1024, Layers: 24, Heads: 16, KVHeads: 16, HeadDim: 64, FFNDim: 3072},
}

var vocabs = map[string]int{"tiny": 4096, "small": 32000, "400m": 32000}

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "bench-llamacpp:", err)
		os.Exit(1)
	}
}

func run() error {
	llama := flag.String("llama-cpp", envOr("LLAMA_CPP", "/var/tmp/llamacpp"), "llama.cpp's directory (its build/bin holds llama-bench, llama-batched-bench, llama-simple)")
	zinf := flag.String("zinf-decode", "bin/zinf-decode", "the zinf-decode program")
	dir := flag.String("dir", "/var/tmp", "where the run's directory of model files is made (removed at the end)")
	size := flag.String("size", "400m", "the model: tiny, small or 400m")
	typesFlag := flag.String("types", "f32,bf16,q8_0", "the stored types, comma-separated (f32, bf16, q8_0, q4_0)")
	batchesFlag := flag.String("batches", "1,4", "batch sizes, comma-separated (1 runs llama-bench, others llama-batched-bench)")
	tokens := flag.Int("tokens", 32, "decoding steps a measurement")
	prompt := flag.Int("prompt", 8, "prompt tokens of each sequence at batch > 1")
	rounds := flag.Int("rounds", 3, "interleaved rounds")
	threads := flag.Int("threads", runtime.NumCPU(), "threads of both systems")
	seed := flag.Uint64("seed", 1, "the weights' seed")
	check := flag.Int("check", 8, "greedy tokens compared between the two systems (0: no check)")
	keep := flag.Bool("keep", false, "keep the run's directory of model files (its path is printed)")
	parts := flag.String("parts", "ram,past-ram", "what to run, comma-separated: ram (the models above in memory), past-ram (one model larger than the RAM)")
	prType := flag.String("past-ram-type", "bf16", "past RAM: the matrices' stored type (bf16, q8_0, q4_0)")
	prFactor := flag.Float64("past-ram-factor", 1.12, "past RAM: the model's bytes over the RAM (MemTotal), 1.0..4")
	prTokens := flag.Int("past-ram-tokens", 4, "past RAM: decoding steps a measurement")
	prRounds := flag.Int("past-ram-rounds", 3, "past RAM: interleaved rounds")
	prModel := flag.String("past-ram-model", "", "past RAM: an existing GGUF file to use instead of writing one (neither written nor removed)")
	prTimeout := flag.Duration("past-ram-timeout", 6*time.Minute, "past RAM: a llama.cpp run that takes longer is stopped and counted at its time so far (a bound below its seconds a token)")
	prKeep := flag.String("past-ram-keep", "auto", "past RAM: weight bytes zinf keeps in its pinned pool, e.g. 16GiB (auto: the memory available less four layers and 3 GiB)")
	flag.Parse()
	runRAM, runPast := false, false
	for _, s := range strings.Split(*parts, ",") {
		switch strings.TrimSpace(s) {
		case "ram":
			runRAM = true
		case "past-ram":
			runPast = true
		default:
			return fmt.Errorf("-parts: %q (allowed: ram, past-ram)", s)
		}
	}

	bin := filepath.Join(*llama, "build", "bin")
	for _, b := range []string{"llama-bench", "llama-batched-bench", "llama-simple"} {
		if _, err := os.Stat(filepath.Join(bin, b)); err != nil {
			fmt.Printf("bench-llamacpp: llama.cpp's %s is not in %s: skipped (set LLAMA_CPP to a llama.cpp directory built with %s; ../shared/peers/llamacpp/build.sh builds one)\n", b, bin, "cmake --build build --target llama-bench llama-batched-bench llama-simple")
			return nil
		}
	}
	if _, err := os.Stat(*zinf); err != nil {
		return fmt.Errorf("-zinf-decode %s: %w (make bench-llamacpp builds it)", *zinf, err)
	}
	shape, ok := shapes[*size]
	if !ok {
		return fmt.Errorf("-size %q (allowed: tiny, small, 400m)", *size)
	}
	shape.RoPEBase, shape.NormEps = 10000, 1e-5
	vocab := vocabs[*size]
	var dtypes []kernels.DType
	for _, s := range strings.Split(*typesFlag, ",") {
		t, ok := map[string]kernels.DType{"f32": kernels.F32, "bf16": kernels.BF16, "q8_0": kernels.Q8_0, "q4_0": kernels.Q4_0}[strings.TrimSpace(s)]
		if !ok {
			return fmt.Errorf("-types: %q (allowed: f32, bf16, q8_0, q4_0)", s)
		}
		dtypes = append(dtypes, t)
	}
	var batches []int
	for _, s := range strings.Split(*batchesFlag, ",") {
		var b int
		if _, err := fmt.Sscan(strings.TrimSpace(s), &b); err != nil || b < 1 || b > 64 {
			return fmt.Errorf("-batches: %q (allowed: 1..64)", s)
		}
		batches = append(batches, b)
	}
	if *tokens < 1 || *rounds < 1 || *threads < 1 || *prompt < 1 {
		return fmt.Errorf("-tokens %d, -rounds %d, -threads %d and -prompt %d must each be at least 1", *tokens, *rounds, *threads, *prompt)
	}
	var pr *pastRAM
	if runPast {
		pr = &pastRAM{bin: bin, zinf: *zinf, dir: *dir, factor: *prFactor, tokens: *prTokens, rounds: *prRounds, threads: *threads, seed: *seed, model: *prModel, keep: -1, keepFile: *keep, timeout: *prTimeout}
		t, ok := map[string]kernels.DType{"bf16": kernels.BF16, "q8_0": kernels.Q8_0, "q4_0": kernels.Q4_0}[*prType]
		switch {
		case !ok:
			return fmt.Errorf("-past-ram-type: %q (allowed: bf16, q8_0, q4_0)", *prType)
		case !(*prFactor >= 1 && *prFactor <= 4):
			return fmt.Errorf("-past-ram-factor %v (allowed: 1.0..4)", *prFactor)
		case *prTokens < 1 || *prRounds < 1:
			return fmt.Errorf("-past-ram-tokens %d and -past-ram-rounds %d must each be at least 1", *prTokens, *prRounds)
		case *prTimeout < time.Second:
			return fmt.Errorf("-past-ram-timeout %v (allowed: 1s or more)", *prTimeout)
		}
		pr.typ = t
		if *prKeep != "auto" {
			n, err := config.ParseSize(*prKeep)
			if err != nil || n < 0 {
				return fmt.Errorf("-past-ram-keep: %q (allowed: auto, or a size such as 16GiB)", *prKeep)
			}
			pr.keep = n
		}
	}
	if !runRAM {
		return pr.run()
	}

	work, err := os.MkdirTemp(*dir, "zinf-bench-llamacpp-")
	if err != nil {
		return err
	}
	if *keep {
		fmt.Printf("# model files kept in %s\n", work)
	} else {
		defer os.RemoveAll(work) // the run's own directory
	}
	commit, _ := os.ReadFile(filepath.Join(*llama, "COMMIT"))
	c := decoder.Config{Vocab: vocab, Dim: shape.Dim, Layers: shape.Layers, Heads: shape.Heads, KVHeads: shape.KVHeads,
		HeadDim: shape.HeadDim, FFNDim: shape.FFNDim, Block: decoder.PreNorm, Norm: decoder.RMSNorm, FinalNorm: decoder.RMSNorm,
		NormEps: shape.NormEps, Activation: decoder.SiLU, Gated: true, RoPEBase: shape.RoPEBase, RoPEInterleaved: true}
	names, err := c.Names(decoder.GGUFNames, "")
	if err != nil {
		return err
	}
	var params int64
	for _, n := range names {
		p := int64(1)
		for _, d := range c.Shape(n.Role) {
			p *= int64(d)
		}
		params += p
	}
	fmt.Printf("# zinf native decoder vs llama.cpp %.12s, same GGUF files\n", strings.TrimSpace(string(commit)))
	fmt.Printf("# machine: %s, %d CPUs; threads %d; %s; load average at the start %s\n", cpuModel(), runtime.NumCPU(), *threads, runtime.Version(), loadAvg())
	fmt.Printf("# model: llama, %d parameters (dim %d, %d layers, %d heads, %d kv heads, ffn %d, vocab %d), random weights seed %d\n",
		params, c.Dim, c.Layers, c.Heads, c.KVHeads, c.FFNDim, c.Vocab, *seed)
	fmt.Printf("# %d decoding steps a measurement, %d rounds, order alternating; batch 1: llama-bench -p 0 -n %d; batch>1: llama-batched-bench -npp %d -ntg %d (zinf: the same prompt length)\n",
		*tokens, *rounds, *tokens, *prompt, *tokens)

	files := map[kernels.DType]string{}
	for _, t := range dtypes {
		path := filepath.Join(work, "model-"+t.String()+".gguf")
		start := time.Now()
		if err := writeModel(path, c, shape, t, *seed, max(4096, 2*(*prompt+*tokens)+64)); err != nil {
			return err
		}
		st, _ := os.Stat(path)
		fmt.Printf("# wrote %s: %.1f MiB in %.1f s\n", filepath.Base(path), float64(st.Size())/(1<<20), time.Since(start).Seconds())
		files[t] = path
	}

	if *check > 0 {
		for _, t := range dtypes {
			agree(bin, *zinf, files[t], t, *check, *threads)
		}
	}

	type key struct {
		t     kernels.DType
		batch int
	}
	res := map[key]*[2][]float64{} // [llama.cpp, zinf] tokens/s
	for r := range *rounds {
		for _, t := range dtypes {
			for _, b := range batches {
				k := key{t, b}
				if res[k] == nil {
					res[k] = &[2][]float64{}
				}
				order := []int{0, 1}
				if r%2 == 1 {
					order = []int{1, 0}
				}
				for _, who := range order {
					var v float64
					var err error
					if who == 0 {
						v, err = llamaTokensPerS(bin, files[t], b, *tokens, *prompt, *threads)
					} else {
						v, err = zinfTokensPerS(*zinf, files[t], b, *tokens, *prompt, *threads)
					}
					if err != nil {
						return fmt.Errorf("round %d, %v batch %d: %w", r, t, b, err)
					}
					res[k][who] = append(res[k][who], v)
				}
				fmt.Printf("# round %d %v batch %d: llama.cpp %.2f, zinf %.2f tokens/s\n", r, t, b, res[k][0][r], res[k][1][r])
			}
		}
	}
	// Other processes on the cores skew both systems, llama.cpp's most
	// (its threads wait for each other at every operation): the load
	// says how quiet the machine was.
	fmt.Printf("# load average at the end %s\n\n", loadAvg())
	fmt.Println("| case | llama.cpp tokens/s | zinf tokens/s | zinf / llama.cpp |")
	fmt.Println("|---|---|---|---|")
	for _, t := range dtypes {
		for _, b := range batches {
			v := res[key{t, b}]
			lm, zm := median(v[0]), median(v[1])
			fmt.Printf("| %v, batch %d | %.2f (%.2f..%.2f) | %.2f (%.2f..%.2f) | %.2f |\n", t, b,
				lm, slicesMin(v[0]), slicesMax(v[0]), zm, slicesMin(v[1]), slicesMax(v[1]), zm/lm)
		}
	}
	if pr != nil {
		fmt.Println()
		return pr.run()
	}
	return nil
}

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

// writeModel writes the model's random weights in type t: each tensor
// drawn from its own stream (seed, tensor index), so every type stores
// the same values, rounded; matrices N(0, 1/in), norm scales near 1.
func writeModel(path string, c decoder.Config, shape gguf.ModelShape, t kernels.DType, seed uint64, ctx int) error {
	return writeRandom(path, "zinf-bench", c, shape, t, seed, ctx, func(rng *rand.Rand, v []float32, mean, sd float64) {
		for j := range v {
			v[j] = float32(mean + sd*rng.NormFloat64())
		}
	})
}

// writeRandom writes a llama model named name whose matrices are stored
// in t (the norms in f32), each tensor's values from fill with its own
// stream (seed, tensor index), its mean and standard deviation: matrices
// 0 and 1/sqrt(in), norm scales 1 and 0.1.
func writeRandom(path, name string, c decoder.Config, shape gguf.ModelShape, t kernels.DType, seed uint64, ctx int, fill func(rng *rand.Rand, v []float32, mean, sd float64)) error {
	w := gguf.NewWriter()
	if err := errors.Join(w.SetLlama(name, shape, ctx), w.SetByteVocab(c.Vocab)); err != nil {
		return err
	}
	names, err := c.Names(decoder.GGUFNames, "")
	if err != nil {
		return err
	}
	for i, n := range names {
		s := c.Shape(n.Role)
		typ := kernels.F32
		if len(s) == 2 {
			typ = t
		}
		gt, err := gguf.TypeOf(typ)
		if err != nil {
			return err
		}
		if err := w.AddTensorFunc(n.Name, gt, s, func() ([]byte, error) {
			size := 1
			for _, d := range s {
				size *= d
			}
			v := make([]float32, size)
			mean, sd := 1.0, 0.1
			if len(s) == 2 {
				mean, sd = 0, 1/math.Sqrt(float64(s[1]))
			}
			fill(rand.New(rand.NewPCG(seed, uint64(i))), v, mean, sd)
			return kernels.Encode(typ, v)
		}); err != nil {
			return err
		}
	}
	return w.WriteFile(path)
}

// agree runs llama-simple and zinf-decode greedily on the same prompt and
// prints whether their continuations are the same text.
func agree(bin, zinf, path string, t kernels.DType, n, threads int) {
	const prompt = "zinf"
	out, err := exec.Command(filepath.Join(bin, "llama-simple"), "-m", path, "-n", fmt.Sprint(n), prompt).Output()
	if err != nil {
		fmt.Printf("# check %v: llama-simple failed: %v\n", t, err)
		return
	}
	// llama-simple prints the prompt's pieces (<s> then the bytes), then
	// the continuation, then a newline.
	lt := strings.TrimSuffix(string(out), "\n")
	lt = strings.TrimPrefix(strings.TrimPrefix(lt, "<s>"), prompt)
	var r struct{ Text string }
	zout, err := exec.Command(zinf, "-model", path, "-prompt-bytes", prompt, "-tokens", fmt.Sprint(n), "-threads", fmt.Sprint(threads)).Output()
	if err == nil {
		err = json.Unmarshal(zout, &r)
	}
	if err != nil {
		fmt.Printf("# check %v: zinf-decode failed: %v\n", t, err)
		return
	}
	// Compare token by token: the pieces are "[tN]" or one byte.
	lp, zp := pieces(lt), pieces(r.Text)
	same := 0
	for same < len(lp) && same < len(zp) && lp[same] == zp[same] {
		same++
	}
	verdict := "the same"
	if same < min(len(lp), len(zp)) {
		verdict = fmt.Sprintf("the same for %d tokens, then llama.cpp %q, zinf %q", same, lp[same], zp[same])
	} else if len(lp) != len(zp) {
		verdict = fmt.Sprintf("the same for %d tokens (llama.cpp gave %d, zinf %d)", same, len(lp), len(zp))
	}
	fmt.Printf("# check %v: greedy continuation of %q: %s\n#   llama.cpp: %s\n#   zinf:      %s\n", t, prompt, verdict, lt, r.Text)
}

// pieces splits a continuation of SetByteVocab's tokens into their
// pieces: "[tN]" or a single byte.
func pieces(s string) []string {
	var out []string
	for len(s) > 0 {
		// "[t", digits, "]": a filler token; anything else one byte.
		j := 2
		for j < len(s) && s[j] >= '0' && s[j] <= '9' {
			j++
		}
		if strings.HasPrefix(s, "[t") && j > 2 && j < len(s) && s[j] == ']' {
			out = append(out, s[:j+1])
			s = s[j+1:]
			continue
		}
		out = append(out, s[:1])
		s = s[1:]
	}
	return out
}

// llamaTokensPerS measures llama.cpp's decoding tokens/s.
func llamaTokensPerS(bin, path string, batch, tokens, prompt, threads int) (float64, error) {
	if batch == 1 {
		out, err := exec.Command(filepath.Join(bin, "llama-bench"), "-m", path, "-t", fmt.Sprint(threads), "-p", "0", "-n", fmt.Sprint(tokens), "-r", "1", "-o", "json").Output()
		if err != nil {
			return 0, fmt.Errorf("llama-bench: %w", err)
		}
		var rs []struct {
			NGen  int     `json:"n_gen"`
			AvgTS float64 `json:"avg_ts"`
		}
		if err := json.Unmarshal(out, &rs); err != nil || len(rs) != 1 || rs[0].NGen != tokens {
			return 0, fmt.Errorf("llama-bench's output %.200q: %v", out, err)
		}
		return rs[0].AvgTS, nil
	}
	// llama.cpp splits the context among the sequences (each gets
	// -c / batch positions) while the bench checks the batch's positions
	// together against one sequence's share: -c must be batch^2 times a
	// sequence's need, or the case is skipped without a word.
	ctx := batch * batch * (prompt + tokens + 16)
	// llama.cpp's log thread sometimes loses the result line at exit (2
	// runs of 6 on a loaded 2-vCPU machine, exit status 0): run again.
	var err error
	for try := range 4 {
		var v float64
		if v, err = batchedOnce(bin, path, batch, tokens, prompt, threads, ctx); err == nil {
			return v, nil
		}
		fmt.Fprintf(os.Stderr, "bench-llamacpp: try %d: %v\n", try+1, err)
	}
	return 0, err
}

// batchedOnce runs llama-batched-bench once and returns its decoding
// tokens/s over the batch.
func batchedOnce(bin, path string, batch, tokens, prompt, threads, ctx int) (float64, error) {
	cmd := exec.Command(filepath.Join(bin, "llama-batched-bench"), "-m", path, "-t", fmt.Sprint(threads), "-c", fmt.Sprint(ctx),
		"-b", "2048", "-ub", "512", "-npp", fmt.Sprint(prompt), "-ntg", fmt.Sprint(tokens), "-npl", fmt.Sprint(batch), "--output-format", "jsonl")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return 0, fmt.Errorf("llama-batched-bench: %w: %s", err, tail(stderr.String()))
	}
	// The JSON line may come on either stream (its log goes to stderr).
	for _, s := range []string{stdout.String(), stderr.String()} {
		sc := bufio.NewScanner(strings.NewReader(s))
		sc.Buffer(make([]byte, 1<<16), 1<<20)
		for sc.Scan() {
			line := strings.TrimSpace(sc.Text())
			if !strings.HasPrefix(line, "{") {
				continue
			}
			var r struct {
				PL      int     `json:"pl"`
				TG      int     `json:"tg"`
				SpeedTG float64 `json:"speed_tg"`
			}
			if json.Unmarshal([]byte(line), &r) == nil && r.PL == batch && r.TG == tokens {
				return r.SpeedTG, nil
			}
		}
	}
	return 0, fmt.Errorf("llama-batched-bench printed no result line for pl %d tg %d: %s", batch, tokens, tail(stdout.String()+stderr.String()))
}

// zinfTokensPerS measures zinf-decode's decoding tokens/s.
func zinfTokensPerS(zinf, path string, batch, tokens, prompt, threads int) (float64, error) {
	args := []string{"-model", path, "-batch", fmt.Sprint(batch), "-tokens", fmt.Sprint(tokens), "-threads", fmt.Sprint(threads)}
	if batch > 1 {
		args = append(args, "-prompt-len", fmt.Sprint(prompt))
	}
	cmd := exec.Command(zinf, args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return 0, fmt.Errorf("zinf-decode: %w: %s", err, tail(stderr.String()))
	}
	var r struct {
		TokensPerS float64 `json:"tokens_per_s"`
	}
	if err := json.Unmarshal(stdout.Bytes(), &r); err != nil {
		return 0, fmt.Errorf("zinf-decode's output %.200q: %w", stdout.String(), err)
	}
	return r.TokensPerS, nil
}

func tail(s string) string {
	if len(s) > 600 {
		return "..." + s[len(s)-600:]
	}
	return s
}

func median(v []float64) float64 {
	s := append([]float64(nil), v...)
	sort.Float64s(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

func slicesMin(v []float64) float64 {
	m := v[0]
	for _, x := range v {
		m = min(m, x)
	}
	return m
}

func slicesMax(v []float64) float64 {
	m := v[0]
	for _, x := range v {
		m = max(m, x)
	}
	return m
}

func cpuModel() string {
	b, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		return runtime.GOARCH
	}
	for _, l := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(l, "model name") {
			if i := strings.IndexByte(l, ':'); i > 0 {
				return strings.TrimSpace(l[i+1:])
			}
		}
	}
	return runtime.GOARCH
}

// loadAvg returns the 1, 5 and 15 minute load averages ("?" where
// /proc/loadavg is absent).
func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], " ")
}

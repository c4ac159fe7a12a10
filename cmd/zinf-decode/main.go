// Command zinf-decode decodes greedily with zinf's native decoder from a
// GGUF file of the llama architecture: it reads the header, puts every
// weight in one buffer of a zinf pinned pool (read from the file in
// place, tensor by tensor, as stored: f32, bf16, q8_0, q4_0; f16 widened
// to f32), prefills a prompt for each of -batch sequences and times
// -tokens greedy decoding steps, printing one JSON object: the tokens a
// second over all sequences, each step's time, and the generated ids and
// their text.
//
//	zinf-decode -model model.gguf -batch 1 -tokens 64
//
// The prompt is -prompt-ids (comma-separated token ids), or -prompt-bytes
// (a text whose every byte is looked up as the SentencePiece byte token
// <0xNN>, after <s>: what llama.cpp's tokenizer gives a vocabulary with no
// other token for those bytes, such as gguf.Writer.SetByteVocab's), or,
// by default, the BOS token. Every sequence of the batch gets the same
// prompt and so the same tokens; -prompt-len N instead gives sequence b
// the ids (b*131 + i*17 + 3) mod vocab, i < N, so that the batch's
// sequences differ (as llama.cpp's batched bench's random prompts do).
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"runtime/pprof"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/zinfio/zinf/buffers"
	"github.com/zinfio/zinf/decoder"
	"github.com/zinfio/zinf/decoder/kernels"
	"github.com/zinfio/zinf/decoder/stream"
	"github.com/zinfio/zinf/gguf"
)

func main() {
	if err := run(context.Background(), os.Args[1:], os.Stdout, os.Stderr); err != nil {
		if !errors.Is(err, flag.ErrHelp) {
			fmt.Fprintln(os.Stderr, "zinf-decode:", err)
		}
		os.Exit(2)
	}
}

// Result is what zinf-decode prints.
type Result struct {
	Model      string  `json:"model"`
	Types      string  `json:"types"` // the matrices' stored types
	Params     int64   `json:"params"`
	Batch      int     `json:"batch"`
	Tokens     int     `json:"tokens"` // decoding steps timed
	Prompt     int     `json:"prompt"` // prompt tokens of each sequence
	Workers    int     `json:"workers"`
	Kernel     string  `json:"kernel"`
	Pinned     bool    `json:"pinned"`
	LoadS      float64 `json:"load_s"`
	PrefillS   float64 `json:"prefill_s"`
	DecodeS    float64 `json:"decode_s"`
	TokensPerS float64 `json:"tokens_per_s"` // batch x tokens / decode_s
	StepMedMs  float64 `json:"step_median_ms"`
	StepMinMs  float64 `json:"step_min_ms"`
	StepMaxMs  float64 `json:"step_max_ms"`
	// IDs are the tokens each sequence generated (the first from the
	// prefill's logits); Text their pieces (sequence 0).
	IDs  [][]int32 `json:"ids"`
	Text string    `json:"text"`
	// Stream is what -stream did: absent without it.
	Stream *StreamResult `json:"stream,omitempty"`
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("zinf-decode", flag.ContinueOnError)
	fs.SetOutput(stderr)
	model := fs.String("model", "", "the GGUF file (llama architecture)")
	batch := fs.Int("batch", 1, "sequences decoded together (1..64)")
	tokens := fs.Int("tokens", 32, "greedy decoding steps timed (1..65536)")
	promptIDs := fs.String("prompt-ids", "", "the prompt as comma-separated token ids")
	promptBytes := fs.String("prompt-bytes", "", "the prompt as text, each byte its <0xNN> token after <s>")
	promptLen := fs.Int("prompt-len", 0, "a prompt of this many ids, different for each sequence (0: the BOS token, or -prompt-ids / -prompt-bytes)")
	workers := fs.Int("threads", 0, "goroutines the products are split over (0: GOMAXPROCS)")
	pin := fs.String("pin", "auto", "pin the weights' pool: auto, required or off")
	cpuProfile := fs.String("cpuprofile", "", "write a CPU profile of the timed decoding steps to this file (created; an existing file is an error)")
	streamOn := fs.Bool("stream", false, "stream the weights from the file through a zinf pinned pool, layer by layer with prefetch, instead of reading them all into memory (a model larger than the RAM)")
	cfgPath := fs.String("config", "", "with -stream: the config file of the tiers (default: the embedded one, its scratch in -dir, its bandwidth probe 256 MiB)")
	dir := fs.String("dir", "", "with -stream: the runtime's scratch directory, which must allow O_DIRECT (default: a run directory in $TMPDIR; nothing of the weights is written there)")
	var poolBytes, keepBytes sizeFlag
	keepBytes.n = -1
	fs.Var(&poolBytes, "pool", "with -stream: the pinned pool, e.g. 16GiB (zinf.tiers.cpu_pinned_bytes; default: the config's)")
	fs.Var(&keepBytes, "max-in-cpu", "with -stream: weight bytes the pool keeps for good, spread over the layers, e.g. 12GiB (offload_param.max_in_cpu, given here in bytes): read once, by no decoding step (default: the config's; the embedded one's is 0)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	switch {
	case *model == "":
		return errors.New("-model is required (a GGUF file)")
	case *batch < 1 || *batch > 64:
		return fmt.Errorf("-batch %d is outside 1..64", *batch)
	case *tokens < 1 || *tokens > 1<<16:
		return fmt.Errorf("-tokens %d is outside 1..65536", *tokens)
	case *workers < 0 || *workers > kernels.MaxWorkers:
		return fmt.Errorf("-threads %d is outside 0..%d (0 means GOMAXPROCS)", *workers, kernels.MaxWorkers)
	case *promptLen < 0 || *promptLen > 1<<16:
		return fmt.Errorf("-prompt-len %d is outside 0..65536", *promptLen)
	case btoi(*promptIDs != "")+btoi(*promptBytes != "")+btoi(*promptLen > 0) > 1:
		return errors.New("-prompt-ids, -prompt-bytes and -prompt-len exclude each other (give one)")
	}
	pinPolicy, err := buffers.ParsePinPolicy(*pin)
	if err != nil {
		return fmt.Errorf("-pin %q: allowed: auto, required, off", *pin)
	}
	if !*streamOn {
		switch {
		case *cfgPath != "":
			return errors.New("-config is for -stream (the tiers the weights stream through)")
		case *dir != "":
			return errors.New("-dir is for -stream")
		case poolBytes.set || keepBytes.set:
			return errors.New("-pool and -max-in-cpu are for -stream")
		}
	} else if *pin != "auto" {
		return errors.New("-pin is for the weights read whole; with -stream the config's offload_param.pin_memory says")
	}

	start := time.Now()
	f, err := gguf.Open(*model)
	if err != nil {
		return err
	}
	defer f.Close()
	m, err := f.Model()
	if err != nil {
		return err
	}
	c := m.Config
	tok, _ := f.Tokenizer() // optional: the text of the ids
	prompts, err := makePrompts(c, tok, *batch, *promptIDs, *promptBytes, *promptLen)
	if err != nil {
		return err
	}
	maxLen := len(prompts[0]) + *tokens
	if maxLen > m.ContextLength {
		return fmt.Errorf("a prompt of %d and %d tokens need %d positions, above the model's context_length %d", len(prompts[0]), *tokens, maxLen, m.ContextLength)
	}

	kvh := c.KVHeads
	if kvh == 0 {
		kvh = c.Heads
	}
	n := c.Layers * *batch * maxLen * kvh * c.HeadDim
	cache, err := decoder.NewKVCache(c, *batch, maxLen, make([]float32, n), make([]float32, n))
	if err != nil {
		return err
	}
	kp, err := kernels.NewPool(kernels.Options{Workers: *workers})
	if err != nil {
		return err
	}
	defer kp.Close()
	d, err := decoder.New(c, kp)
	if err != nil {
		return err
	}
	logits := make([]float32, *batch*c.Vocab)
	pos := make([]int, *batch)
	var (
		forward func(toks [][]int32) error
		types   string
		params  int64
		pinned  bool
		sm      *stream.Model
	)
	if *streamOn {
		o := streamOptions{cfgPath: *cfgPath, dir: *dir, pool: poolBytes, keep: keepBytes}
		var done func()
		sm, done, err = openStream(ctx, *model, o, stderr)
		if err != nil {
			return err
		}
		defer done()
		types, params = typesOf(f, c)
		pinned = sm.Runtime().Metrics().PinnedBytes > 0 && sm.Runtime().Config.ZeroOptimization.OffloadParam.PinMemory
		forward = func(toks [][]int32) error { return sm.Pass(ctx, d, cache, toks, pos, logits) }
	} else {
		mw, layers, pin, done, err := loadWeights(ctx, f, c, pinPolicy)
		if err != nil {
			return err
		}
		defer done()
		types, params = typesOf(f, c)
		pinned = pin
		forward = func(toks [][]int32) error {
			if err := d.Begin(cache, toks, pos, &mw); err != nil {
				return err
			}
			for l := range c.Layers {
				if err := d.Layer(l, &layers[l]); err != nil {
					return err
				}
			}
			return d.Logits(&mw, logits)
		}
	}
	load := time.Since(start)
	pass := func(toks [][]int32) error {
		if err := forward(toks); err != nil {
			return err
		}
		for b := range pos {
			pos[b] += len(toks[b])
		}
		return nil
	}
	ids := make([][]int32, *batch)
	next := func() [][]int32 {
		toks := make([][]int32, *batch)
		for b := range toks {
			row := logits[b*c.Vocab : (b+1)*c.Vocab]
			id := int32(slices.Index(row, slices.Max(row)))
			ids[b] = append(ids[b], id)
			toks[b] = []int32{id}
		}
		return toks
	}
	t0 := time.Now()
	if err := pass(prompts); err != nil {
		return err
	}
	prefill := time.Since(t0)
	steps := make([]float64, 0, *tokens)
	if *cpuProfile != "" {
		// O_EXCL: a profile never overwrites a file zinf did not create.
		pf, err := os.OpenFile(*cpuProfile, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
		if err != nil {
			return fmt.Errorf("-cpuprofile %q: %w", *cpuProfile, err)
		}
		defer pf.Close()
		if err := pprof.StartCPUProfile(pf); err != nil {
			return fmt.Errorf("-cpuprofile %q: %w", *cpuProfile, err)
		}
		defer pprof.StopCPUProfile()
	}
	var st0 stream.Stats
	if sm != nil {
		st0 = sm.Stats()
	}
	computes := make([]float64, 0, *tokens) // a step less its wait for weights (-stream)
	t0 = time.Now()
	for range *tokens {
		if err := ctx.Err(); err != nil {
			return err
		}
		s := time.Now()
		var w0 time.Duration
		if sm != nil {
			w0 = sm.Stats().IOWait
		}
		if err := pass(next()); err != nil {
			return err
		}
		dt := time.Since(s)
		steps = append(steps, dt.Seconds()*1e3)
		if sm != nil {
			computes = append(computes, (dt-(sm.Stats().IOWait-w0)).Seconds()*1e3)
		}
	}
	decode := time.Since(t0)
	if sm != nil {
		sm.EndPasses()
	}
	next()
	ids0 := ids[0][:*tokens] // the tokens fed or about to be; the last step's is not fed
	var text strings.Builder
	if tok != nil {
		for _, id := range ids0 {
			text.WriteString(tok.Piece(int(id)))
		}
	}
	for b := range ids {
		ids[b] = ids[b][:*tokens]
	}
	sorted := slices.Clone(steps)
	sort.Float64s(sorted)
	r := Result{Model: *model, Types: types, Params: params, Batch: *batch, Tokens: *tokens, Prompt: len(prompts[0]),
		Workers: kp.Workers(), Kernel: kp.Kernel(), Pinned: pinned, LoadS: load.Seconds(), PrefillS: prefill.Seconds(),
		DecodeS: decode.Seconds(), TokensPerS: float64(*batch**tokens) / decode.Seconds(),
		StepMedMs: sorted[len(sorted)/2], StepMinMs: sorted[0], StepMaxMs: sorted[len(sorted)-1], IDs: ids, Text: text.String()}
	if math.IsInf(r.TokensPerS, 0) {
		r.TokensPerS = 0
	}
	if sm != nil {
		sr, err := streamResult(sm, st0, *batch, maxLen, computes, decode, int64(2*n)*4)
		if err != nil {
			return err
		}
		r.Stream = sr
	}
	enc := json.NewEncoder(stdout)
	return enc.Encode(r)
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

// makePrompts returns each sequence's prompt.
func makePrompts(c decoder.Config, tok *gguf.Tokenizer, batch int, ids, text string, n int) ([][]int32, error) {
	var p []int32
	switch {
	case ids != "":
		for _, s := range strings.Split(ids, ",") {
			v, err := strconv.Atoi(strings.TrimSpace(s))
			if err != nil || v < 0 || v >= c.Vocab {
				return nil, fmt.Errorf("-prompt-ids: %q is not a token id 0..%d", s, c.Vocab-1)
			}
			p = append(p, int32(v))
		}
	case text != "":
		if tok == nil || tok.BOS < 0 {
			return nil, errors.New("-prompt-bytes: the file has no tokenizer with a BOS token")
		}
		index := map[string]int{}
		for i, s := range tok.Tokens {
			if len(s) == 6 && strings.HasPrefix(s, "<0x") {
				index[s] = i
			}
		}
		p = append(p, int32(tok.BOS))
		for i := range len(text) {
			id, ok := index[fmt.Sprintf("<0x%02X>", text[i])]
			if !ok {
				return nil, fmt.Errorf("-prompt-bytes: the vocabulary has no byte token <0x%02X>", text[i])
			}
			p = append(p, int32(id))
		}
	case n > 0:
		out := make([][]int32, batch)
		for b := range out {
			for i := range n {
				out[b] = append(out[b], int32((b*131+i*17+3)%c.Vocab))
			}
		}
		return out, nil
	default:
		bos := 1
		if tok != nil && tok.BOS >= 0 {
			bos = tok.BOS
		}
		if bos >= c.Vocab {
			bos = 0
		}
		p = []int32{int32(bos)}
	}
	out := make([][]int32, batch)
	for b := range out {
		out[b] = p
	}
	return out, nil
}

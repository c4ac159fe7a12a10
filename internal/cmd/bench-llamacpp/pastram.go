package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"

	"github.com/zinfio/zinf/decoder"
	"github.com/zinfio/zinf/decoder/kernels"
	"github.com/zinfio/zinf/gguf"
	"github.com/zinfio/zinf/internal/base/memlimit"
	"github.com/zinfio/zinf/metrics/procstat"
)

// pastRAM is the past-RAM half of the bench: one model larger than the
// machine's memory, decoded by llama.cpp (the file mapped, as llama.cpp
// maps it by default: the kernel pages it in and out) and by zinf-decode
// -stream (the weights read in place with O_DIRECT through zinf's pinned
// pool, as much of them kept there as the memory allows), batch 1,
// interleaved rounds.
type pastRAM struct {
	bin, zinf, dir string
	typ            kernels.DType
	factor         float64 // the model's bytes over the RAM
	tokens, rounds int
	threads        int
	seed           uint64
	model          string // an existing file to use (not written, not removed)
	keep           int64  // bytes zinf keeps in its pool; -1: from the memory available
	keepFile       bool
	// timeout ends a llama.cpp run that thrashes past it: its seconds a
	// token are then counted as the run's time over its tokens (the
	// warm-up's included), a bound below what it would have taken.
	timeout time.Duration
}

// pastRAMConfig is the model: llama-13B's widths (dim 5120, 40 heads of
// 128, ffn 13824, vocab 32000) with as many layers as make its weights
// factor x ram bytes in typ.
func pastRAMConfig(typ kernels.DType, ram int64, factor float64) (decoder.Config, gguf.ModelShape, int64, error) {
	shape := gguf.ModelShape{Dim: 5120, Heads: 40, KVHeads: 40, HeadDim: 128, FFNDim: 13824, RoPEBase: 10000, NormEps: 1e-5}
	c := decoder.Config{Vocab: 32000, Dim: shape.Dim, Layers: 1, Heads: shape.Heads, KVHeads: shape.KVHeads,
		HeadDim: shape.HeadDim, FFNDim: shape.FFNDim, Block: decoder.PreNorm, Norm: decoder.RMSNorm, FinalNorm: decoder.RMSNorm,
		NormEps: shape.NormEps, Activation: decoder.SiLU, Gated: true, RoPEBase: shape.RoPEBase, RoPEInterleaved: true}
	bytesOf := func(c decoder.Config) (int64, error) {
		names, err := c.Names(decoder.GGUFNames, "")
		if err != nil {
			return 0, err
		}
		var n int64
		for _, nm := range names {
			s := c.Shape(nm.Role)
			t := kernels.F32
			if len(s) == 2 {
				t = typ
			}
			rb, err := kernels.RowBytes(t, s[len(s)-1])
			if err != nil {
				return 0, err
			}
			rows := int64(1)
			if len(s) == 2 {
				rows = int64(s[0])
			}
			n += rows * int64(rb)
		}
		return n, nil
	}
	one, err := bytesOf(c)
	if err != nil {
		return c, shape, 0, err
	}
	c.Layers = 2
	two, err := bytesOf(c)
	if err != nil {
		return c, shape, 0, err
	}
	perLayer, rest := two-one, 2*one-two
	c.Layers = int(math.Ceil((factor*float64(ram) - float64(rest)) / float64(perLayer)))
	c.Layers = max(c.Layers, 1)
	shape.Layers = c.Layers
	total, err := bytesOf(c)
	return c, shape, total, err
}

// writeFast writes the model's random weights quickly: uniform values
// with the variance writeModel's normal ones have (matrices 1/in, norm
// scales 1 +- 0.1), 8 from one 64-bit draw. The values only have to make
// a model whose activations stay finite: the past-RAM bench times bytes.
func writeFast(path string, c decoder.Config, shape gguf.ModelShape, t kernels.DType, seed uint64, ctx int) error {
	return writeRandom(path, "zinf-bench-past-ram", c, shape, t, seed, ctx, func(rng *rand.Rand, v []float32, mean, sd float64) {
		// A byte b is uniform on 0..255: (b - 127.5) / 73.9 has
		// variance 1.
		scale := float32(sd / 73.9)
		for j := 0; j < len(v); j += 8 {
			r := rng.Uint64()
			for k := j; k < min(j+8, len(v)); k++ {
				v[k] = float32(mean) + (float32(r&255)-127.5)*scale
				r >>= 8
			}
		}
	})
}

// zinfStreamResult is what the bench reads of zinf-decode -stream's JSON.
type zinfStreamResult struct {
	TokensPerS float64 `json:"tokens_per_s"`
	StepMedMs  float64 `json:"step_median_ms"`
	LoadS      float64 `json:"load_s"`
	Stream     struct {
		PoolBytes     int64   `json:"pool_bytes"`
		KeptBytes     int64   `json:"kept_bytes"`
		StreamedBytes int64   `json:"streamed_bytes"`
		StepReadBytes int64   `json:"step_read_bytes"`
		IOWaitMs      float64 `json:"io_wait_median_ms"`
		ComputeMs     float64 `json:"compute_median_ms"`
		ReadGBps      float64 `json:"read_gb_per_s"`
		PlanReadGBps  float64 `json:"plan_read_gb_per_s"`
		FloorMs       float64 `json:"floor_ms"`
		FloorBound    string  `json:"floor_bound"`
		PeakRSSMiB    float64 `json:"peak_rss_mib"`
		RSSBoundMiB   float64 `json:"rss_bound_mib"`
	} `json:"stream"`
}

func (p *pastRAM) run() error {
	ram := procstat.MemTotal()
	if ram <= 0 {
		return errors.New("past RAM: the machine's memory (MemTotal) cannot be read")
	}
	c, shape, total, err := pastRAMConfig(p.typ, ram, p.factor)
	if err != nil {
		return err
	}
	path := p.model
	if path == "" {
		var st unix.Statfs_t
		if err := unix.Statfs(p.dir, &st); err != nil {
			return fmt.Errorf("-dir %s: %w", p.dir, err)
		}
		if free := int64(st.Bavail) * int64(st.Bsize); free < total+2<<30 {
			fmt.Printf("# past RAM: skipped: the model needs %.1f GiB in %s (and 2 GiB to spare), %.1f GiB are free (-past-ram=false skips it; -past-ram-factor sizes it)\n",
				gib(total), p.dir, gib(free))
			return nil
		}
		work, err := os.MkdirTemp(p.dir, "zinf-bench-past-ram-")
		if err != nil {
			return err
		}
		if p.keepFile {
			fmt.Printf("# past RAM: the model file is kept in %s\n", work)
		} else {
			defer os.RemoveAll(work) // the run's own directory
		}
		path = filepath.Join(work, "model-"+p.typ.String()+".gguf")
		start := time.Now()
		if err := writeFast(path, c, shape, p.typ, p.seed, 4096); err != nil {
			return err
		}
		fmt.Printf("# past RAM: wrote %s: %.2f GiB in %.0f s\n", path, gib(total), time.Since(start).Seconds())
	} else {
		f, err := gguf.Open(path)
		if err != nil {
			return fmt.Errorf("-past-ram-model: %w", err)
		}
		m, err := f.Model()
		f.Close()
		if err != nil {
			return fmt.Errorf("-past-ram-model: %w", err)
		}
		c = m.Config
		st, err := os.Stat(path)
		if err != nil {
			return fmt.Errorf("-past-ram-model: %w", err)
		}
		total = st.Size()
		fmt.Printf("# past RAM: the model %s (%.2f GiB)\n", path, gib(total))
	}
	keep := p.keep
	if keep < 0 {
		// What the memory holds besides the pool's swap buffers (four of
		// a layer's size), the KV cache and 3 GiB for the rest of the
		// machine, in whole GiB.
		lim, ok := memlimit.Available()
		if !ok {
			return errors.New("past RAM: -past-ram-keep auto: the memory available cannot be read (give a size)")
		}
		avail := lim.Bytes
		layer := (total - 2*int64(c.Vocab)*int64(c.Dim)*2) / int64(c.Layers)
		keep = (avail - 4*layer - 3<<30) >> 30 << 30
		keep = max(keep, 0)
	}
	layer := total / int64(c.Layers)
	pool := keep + 4*layer + 256<<20
	fmt.Printf("# past RAM: llama, %d layers (dim %d, %d heads, ffn %d, vocab %d), %v, %.2f GiB = %.2fx the RAM (%.2f GiB); batch 1, %d tokens a measurement, %d rounds alternating\n",
		c.Layers, c.Dim, c.Heads, c.FFNDim, c.Vocab, p.typ, gib(total), float64(total)/float64(ram), gib(ram), p.tokens, p.rounds)
	fmt.Printf("#   llama.cpp: llama-bench -p 0 -n %d -t %d (the file mapped; the kernel pages it)\n", p.tokens, p.threads)
	fmt.Printf("#   zinf:      zinf-decode -stream -pool %s -max-in-cpu %s (in place, O_DIRECT; the kept weights read once at load)\n", sizeArg(pool), sizeArg(keep))

	var llama, zinf []float64 // seconds a token
	var zr []zinfStreamResult
	for r := range p.rounds {
		order := []int{0, 1}
		if r%2 == 1 {
			order = []int{1, 0}
		}
		for _, who := range order {
			if who == 0 {
				start := time.Now()
				spt, done, err := p.llama(path)
				if err != nil {
					return fmt.Errorf("past RAM, round %d: %w", r, err)
				}
				llama = append(llama, spt)
				if !done {
					fmt.Printf("# past RAM round %d: llama.cpp stopped at -past-ram-timeout %v: more than %.2f s a token (its %d tokens and the warm-up in %.0f s)\n", r, p.timeout, spt, p.tokens, time.Since(start).Seconds())
					continue
				}
				fmt.Printf("# past RAM round %d: llama.cpp %.2f s a token (run %.0f s)\n", r, spt, time.Since(start).Seconds())
				continue
			}
			res, err := p.zinfStream(path, pool, keep)
			if err != nil {
				return fmt.Errorf("past RAM, round %d: %w", r, err)
			}
			zinf = append(zinf, res.StepMedMs/1e3)
			zr = append(zr, res)
			s := res.Stream
			fmt.Printf("# past RAM round %d: zinf %.2f s a token (load %.0f s; kept %.2f GiB, streamed %.2f GiB a step, read %.2f GiB a step at %.2f GB/s, waited %.2f s, computed %.2f s; floor %.2f s (%s, planned read %.2f GB/s); peak RSS %.0f MiB, bound %.0f)\n",
				r, res.StepMedMs/1e3, res.LoadS, gib(s.KeptBytes), gib(s.StreamedBytes), gib(s.StepReadBytes), s.ReadGBps, s.IOWaitMs/1e3, s.ComputeMs/1e3, s.FloorMs/1e3, s.FloorBound, s.PlanReadGBps, s.PeakRSSMiB, s.RSSBoundMiB)
		}
	}
	lm, zm := median(llama), median(zinf)
	var floors, ofFloor, rss []float64
	for _, res := range zr {
		floors = append(floors, res.Stream.FloorMs/1e3)
		ofFloor = append(ofFloor, res.Stream.FloorMs/res.StepMedMs)
		rss = append(rss, res.Stream.PeakRSSMiB)
	}
	fmt.Printf("# load average at the end %s\n\n", loadAvg())
	fmt.Println("| past RAM, batch 1 | llama.cpp s/token | zinf s/token | zinf / llama.cpp | zinf's floor s (plan) | floor / zinf step | zinf peak RSS MiB (bound) |")
	fmt.Println("|---|---|---|---|---|---|---|")
	fmt.Printf("| %v, %.2f GiB, %.2fx RAM | %.2f (%.2f..%.2f) | %.2f (%.2f..%.2f) | %.2f | %.2f (%.2f..%.2f) | %.2f (%.2f..%.2f) | %.0f (%.0f) |\n",
		p.typ, gib(total), float64(total)/float64(ram), lm, slicesMin(llama), slicesMax(llama), zm, slicesMin(zinf), slicesMax(zinf), zm/lm,
		median(floors), slicesMin(floors), slicesMax(floors), median(ofFloor), slicesMin(ofFloor), slicesMax(ofFloor), slicesMax(rss), zr[0].Stream.RSSBoundMiB)
	return nil
}

// llama runs llama-bench once at batch 1 and returns its seconds a token;
// done is false where -past-ram-timeout ended it (see pastRAM.timeout).
func (p *pastRAM) llama(path string) (secs float64, done bool, err error) {
	ctx, cancel := context.WithTimeout(context.Background(), p.timeout)
	defer cancel()
	start := time.Now()
	out, err := exec.CommandContext(ctx, filepath.Join(p.bin, "llama-bench"), "-m", path, "-t", fmt.Sprint(p.threads), "-p", "0", "-n", fmt.Sprint(p.tokens), "-r", "1", "-o", "json").Output()
	if ctx.Err() != nil {
		return time.Since(start).Seconds() / float64(p.tokens+1), false, nil
	}
	if err != nil {
		return 0, false, fmt.Errorf("llama-bench: %w", err)
	}
	var rs []struct {
		NGen  int     `json:"n_gen"`
		AvgTS float64 `json:"avg_ts"`
	}
	if err := json.Unmarshal(out, &rs); err != nil || len(rs) != 1 || rs[0].NGen != p.tokens || rs[0].AvgTS <= 0 {
		return 0, false, fmt.Errorf("llama-bench's output %.200q: %v", out, err)
	}
	return 1 / rs[0].AvgTS, true, nil
}

// zinfStream runs zinf-decode -stream once.
func (p *pastRAM) zinfStream(path string, pool, keep int64) (zinfStreamResult, error) {
	args := []string{"-model", path, "-stream", "-pool", sizeArg(pool), "-max-in-cpu", sizeArg(keep), "-tokens", fmt.Sprint(p.tokens), "-threads", fmt.Sprint(p.threads)}
	cmd := exec.Command(p.zinf, args...)
	// Its run directory (the runtime's scratch, removed at its end) in
	// -dir: a disk that allows O_DIRECT.
	cmd.Env = append(os.Environ(), "TMPDIR="+p.dir)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return zinfStreamResult{}, fmt.Errorf("zinf-decode -stream: %w: %s", err, tail(stderr.String()))
	}
	var r zinfStreamResult
	if err := json.Unmarshal(stdout.Bytes(), &r); err != nil {
		return r, fmt.Errorf("zinf-decode's output %.200q: %w", stdout.String(), err)
	}
	return r, nil
}

func gib(b int64) float64 { return float64(b) / (1 << 30) }

// sizeArg writes bytes as zinf's flags read them.
func sizeArg(b int64) string { return fmt.Sprintf("%dMiB", (b+(1<<20)-1)>>20) }

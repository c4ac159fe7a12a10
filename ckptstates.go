package zinf

import (
	"context"
	"fmt"
	"log/slog"
	"sync"

	"github.com/zinfio/zinf/buffers"
	"github.com/zinfio/zinf/checkpoint"
	"github.com/zinfio/zinf/swapper"
	"github.com/zinfio/zinf/swapper/optimizer"
	"github.com/zinfio/zinf/tensor"
)

// metaOptimizerStates is the format of a checkpoint's optimizer states
// (zinf.optimizer_states) when it is not fp32: "bf16" or "8bit"
// (state-wide). Then "<param>.exp_avg" and "<param>.exp_avg_sq" hold the
// states as the optimizer stores them — bf16 bits, or 8-bit codes (U8)
// with their per-block absmax in "<param>.exp_avg.absmax" and
// "<param>.exp_avg_sq.absmax" (F32, one per 256 elements of the rank's
// partition) — so that loading them into a run of the same format and
// partitions resumes bit for bit.
const metaOptimizerStates = "zinf.optimizer_states"

// absmaxSuffix follows a state's suffix for the absmax of its 8-bit codes.
const absmaxSuffix = ".absmax"

// stateFormatOf returns rt's optimizer state format (zinf.optimizer_states;
// some tensors may keep fp32 states: tensorFormat), its block size set.
func stateFormatOf(rt *Runtime) optimizer.StateFormat {
	f := rt.Optimizer.Options().StateFormat
	if f.Encoding == optimizer.EncodingBlockwise8 {
		return optimizer.FormatBlockwise8
	}
	return f
}

// encodedStates returns the optimizer tensors of name (a partition of n
// elements) of a run whose states are stored narrower than fp32, as the
// optimizer stores them (Optimizer.ReadEncodedStates, read once for all
// of them, each dropped once read to its end).
func encodedStates(rt *Runtime, name string, n int, f optimizer.StateFormat) []checkpoint.Tensor {
	src := &encodedSource{rt: rt, name: name}
	suffixes := stateSuffixes(rt)
	out := []checkpoint.Tensor{checkpoint.FromFunc(name+suffixes[0], swapper.Float32, []int64{int64(n)}, 4*int64(n),
		func(ctx context.Context, dst []byte, off int64) error { return src.read(ctx, 0, dst, off) })}
	blocks := f.Blocks(int64(n))
	for k, suffix := range suffixes[1:] {
		k := k
		switch f.Encoding {
		case optimizer.EncodingBF16:
			out = append(out, checkpoint.FromFunc(name+suffix, swapper.BFloat16, []int64{int64(n)}, 2*int64(n),
				func(ctx context.Context, dst []byte, off int64) error { return src.read(ctx, 1+2*k, dst, off) }))
		default:
			out = append(out, checkpoint.FromFunc(name+suffix, tensor.Uint8, []int64{int64(n)}, int64(n),
				func(ctx context.Context, dst []byte, off int64) error { return src.read(ctx, 1+2*k, dst, off) }),
				checkpoint.FromFunc(name+suffix+absmaxSuffix, swapper.Float32, []int64{blocks}, 4*blocks,
					func(ctx context.Context, dst []byte, off int64) error { return src.read(ctx, 2+2*k, dst, off) }))
		}
	}
	return out
}

// encodedSource serves one parameter's encoded optimizer tensors from one
// ReadEncodedStates: part 0 is the master, then per state its data and
// its absmax.
type encodedSource struct {
	rt    *Runtime
	name  string
	mu    sync.Mutex
	parts [][]byte // nil until read; a part read to its end is dropped
}

func (s *encodedSource) read(ctx context.Context, part int, dst []byte, off int64) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.parts == nil || s.parts[part] == nil {
		m, st, err := s.rt.Optimizer.ReadEncodedStates(ctx, s.name)
		if err != nil {
			return err
		}
		s.parts = [][]byte{buffers.AsBytes(m)}
		for _, e := range st {
			s.parts = append(s.parts, e.Data, buffers.AsBytes(e.Absmax))
		}
	}
	b := s.parts[part]
	copy(dst, b[off:])
	if off+int64(len(dst)) == int64(len(b)) {
		s.parts[part] = nil // read to its end: the Go heap gets it back
	}
	return nil
}

// savedStateTensors lists the optimizer tensors a saved rank holds for a
// partition of elems elements, beside the master, in a checkpoint whose
// states are in format f: name and dtype, for checkSavedRank.
func savedStateTensors(n string, suffixes []string, f optimizer.StateFormat, elems int64) []savedTensor {
	out := []savedTensor{{n + suffixes[0], swapper.Float32, elems}}
	for _, suffix := range suffixes[1:] {
		switch f.Encoding {
		case optimizer.EncodingBF16:
			out = append(out, savedTensor{n + suffix, swapper.BFloat16, elems})
		case optimizer.EncodingBlockwise8:
			out = append(out, savedTensor{n + suffix, tensor.Uint8, elems}, savedTensor{n + suffix + absmaxSuffix, swapper.Float32, f.Blocks(elems)})
		default:
			out = append(out, savedTensor{n + suffix, swapper.Float32, elems})
		}
	}
	return out
}

// savedTensor is a tensor a saved rank must hold: its name, dtype and
// elements.
type savedTensor struct {
	name  string
	dt    swapper.DType
	elems int64
}

// readSavedStates reads a saved rank's optimizer partition of parameter n
// ([p0, p1)) in the checkpoint's format f: the master and the encoded
// states.
func readSavedStates(ctx context.Context, s *savedRank, n string, suffixes []string, f optimizer.StateFormat, elems int) (master []float32, states []optimizer.EncodedState, err error) {
	master = make([]float32, elems)
	if err := s.r.ReadTensor(ctx, n+suffixes[0], buffers.AsBytes(master)); err != nil {
		return nil, nil, err
	}
	for _, suffix := range suffixes[1:] {
		e := optimizer.EncodedState{Format: f}
		switch f.Encoding {
		case optimizer.EncodingBF16:
			e.Data = make([]byte, 2*elems)
		case optimizer.EncodingBlockwise8:
			e.Data = make([]byte, elems)
			e.Absmax = make([]float32, f.Blocks(int64(elems)))
			if err := s.r.ReadTensor(ctx, n+suffix+absmaxSuffix, buffers.AsBytes(e.Absmax)); err != nil {
				return nil, nil, err
			}
		default:
			e.Data = make([]byte, 4*elems)
		}
		if err := s.r.ReadTensor(ctx, n+suffix, e.Data); err != nil {
			return nil, nil, err
		}
		states = append(states, e)
	}
	return master, states, nil
}

// loadTensorStates loads the optimizer states of parameter n into rts
// where a saved rank or a runtime keeps them narrower than fp32 (each
// saved rank's format is read off its tensors' dtypes: savedRank.formats;
// each runtime's from its optimizer, per tensor). Where every runtime's
// format and partition of n are its saved rank's (same world size), each
// rank's states are loaded as they were saved
// (Optimizer.LoadEncodedStates): bit for bit. Otherwise they are decoded
// to fp32, re-partitioned and loaded with LoadStates, which encodes them
// in each runtime's format, and the log says so (once per load: *logged).
func loadTensorStates(ctx context.Context, log *slog.Logger, saved []savedRank, rts []*Runtime, n string, numel int, suffixes []string, optStep int, logged *bool) error {
	byRank := map[int]*savedRank{}
	for i := range saved {
		byRank[saved[i].r.Meta().Rank] = &saved[i]
	}
	same := len(saved) == len(rts)
	why := "the partitions differ (another world size)"
	var sf, rf optimizer.StateFormat
	for _, rt := range rts {
		s := byRank[rt.Rank]
		lo, hi := rt.Partition(n)
		if s == nil || s.parts[n][0] != lo || s.parts[n][1] != hi {
			same = false
			continue
		}
		if hi > lo && s.formats[n] != tensorFormat(rt, n) {
			same, why = false, "zinf.optimizer_states differs"
			sf, rf = s.formats[n], tensorFormat(rt, n)
		}
	}
	if same {
		for _, rt := range rts {
			s := byRank[rt.Rank]
			lo, hi := rt.Partition(n)
			if hi == lo {
				continue
			}
			m, st, err := readSavedStates(ctx, s, n, suffixes, s.formats[n], hi-lo)
			if err != nil {
				return err
			}
			if err := rt.Optimizer.LoadEncodedStates(ctx, n, m, st, optStep); err != nil {
				return fmt.Errorf("zinf: checkpoint: rank %d: %w", rt.Rank, err)
			}
		}
		return nil
	}
	if !*logged {
		*logged = true
		log.Info("zinf: checkpoint: optimizer states converted", slog.String("tensor", n), slog.String("saved", sf.String()), slog.String("run", rf.String()),
			slog.String("why", why), slog.String("how", "decoded to fp32 and encoded again: the run goes on close to the saved one, not bit for bit"))
	}
	st := make([][]float32, len(suffixes))
	for k := range st {
		st[k] = make([]float32, numel)
	}
	for i := range saved {
		s := &saved[i]
		p := s.parts[n]
		if p[1] == p[0] {
			continue
		}
		m, enc, err := readSavedStates(ctx, s, n, suffixes, s.formats[n], p[1]-p[0])
		if err != nil {
			return err
		}
		copy(st[0][p[0]:], m)
		for k, e := range enc {
			d, err := e.Decode(optimizer.StateKind(k + 1))
			if err != nil {
				return fmt.Errorf("zinf: checkpoint: %s%s: %w", n, suffixes[k+1], err)
			}
			copy(st[k+1][p[0]:], d)
		}
	}
	for _, rt := range rts {
		lo, hi := rt.Partition(n)
		states := make([][]float32, len(st)-1)
		for k := range states {
			states[k] = st[k+1][lo:hi]
		}
		if err := rt.Optimizer.LoadStates(ctx, n, st[0][lo:hi], states, optStep); err != nil {
			return fmt.Errorf("zinf: checkpoint: rank %d: %w", rt.Rank, err)
		}
	}
	return nil
}

// compressedAnywhere reports whether a saved rank or a runtime keeps n's
// optimizer states narrower than fp32.
func compressedAnywhere(saved []savedRank, rts []*Runtime, n string) bool {
	for i := range saved {
		if saved[i].formats[n] != optimizer.FormatFP32 {
			return true
		}
	}
	for _, rt := range rts {
		if tensorFormat(rt, n) != optimizer.FormatFP32 {
			return true
		}
	}
	return false
}

// savedFormat reads the format of a saved rank's optimizer states of n
// off the dtype of its first state ("<n>.exp_avg": U8 for 8-bit, BF16 for
// bf16); fp32 otherwise, and for a rule without states.
func savedFormat(r *checkpoint.Reader, n string, suffixes []string) optimizer.StateFormat {
	if len(suffixes) < 2 {
		return optimizer.FormatFP32
	}
	ti, err := r.Tensor(n + suffixes[1])
	if err != nil {
		return optimizer.FormatFP32
	}
	switch ti.DType {
	case tensor.Uint8:
		return optimizer.FormatBlockwise8
	case swapper.BFloat16:
		return optimizer.FormatBF16
	}
	return optimizer.FormatFP32
}

// tensorFormat is how rt's optimizer stores n's states (fp32 for a name it
// does not hold).
func tensorFormat(rt *Runtime, n string) optimizer.StateFormat {
	if f, ok := rt.Optimizer.StateFormatOf(n); ok {
		return f
	}
	return optimizer.FormatFP32
}

// stateSuffixes are the suffixes of a parameter's optimizer tensors in
// rt's checkpoints: ".master", then one per state of the optimizer's rule
// (Adam: ".exp_avg", ".exp_avg_sq"; SGD with momentum: ".momentum_buffer";
// Adagrad: ".sum"; Lion: ".exp_avg"), in record order.
func stateSuffixes(rt *Runtime) []string {
	out := []string{".master"}
	for _, n := range rt.Optimizer.Options().Hyper.StateNames() {
		out = append(out, "."+n)
	}
	return out
}

// savedRank is one rank of a checkpoint being loaded.
type savedRank struct {
	r     *checkpoint.Reader
	parts map[string][3]int
	// formats are its optimizer states' formats by parameter (savedFormat;
	// set by checkSavedRank).
	formats map[string]optimizer.StateFormat
}

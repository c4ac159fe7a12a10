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

// stateFormatOf returns rt's optimizer state format, its block size set.
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

// loadEncodedOptimizer loads the optimizer states of a checkpoint whose
// states are in format f (not fp32, or a run whose are not) into rts. Where
// f is the runtimes' format and every runtime's partitions are the saved
// ones (same world size), each rank's states are loaded as they were
// saved (Optimizer.LoadEncodedStates): bit for bit. Otherwise they are
// decoded to fp32, re-partitioned and loaded with LoadStates, which
// encodes them in the runtimes' format, and the logger says so once.
func loadEncodedOptimizer(ctx context.Context, log *slog.Logger, saved []savedRank, rts []*Runtime, names []string, numel map[string]int, suffixes []string, f optimizer.StateFormat, optStep int) error {
	rf := stateFormatOf(rts[0])
	byRank := map[int]*savedRank{}
	for i := range saved {
		byRank[saved[i].r.Meta().Rank] = &saved[i]
	}
	same := rf == f && len(saved) == len(rts)
	for _, rt := range rts {
		s := byRank[rt.Rank]
		for _, n := range names {
			lo, hi := rt.Partition(n)
			if s == nil || s.parts[n][0] != lo || s.parts[n][1] != hi {
				same = false
			}
		}
	}
	if same {
		for _, n := range names {
			for _, rt := range rts {
				s := byRank[rt.Rank]
				lo, hi := rt.Partition(n)
				if hi == lo {
					continue
				}
				m, st, err := readSavedStates(ctx, s, n, suffixes, f, hi-lo)
				if err != nil {
					return err
				}
				if err := rt.Optimizer.LoadEncodedStates(ctx, n, m, st, optStep); err != nil {
					return fmt.Errorf("zinf: checkpoint: rank %d: %w", rt.Rank, err)
				}
			}
		}
		return nil
	}
	log.Info("zinf: checkpoint: optimizer states converted", slog.String("saved", f.String()), slog.String("run", rf.String()),
		slog.String("why", map[bool]string{true: "the partitions differ (another world size)", false: "zinf.optimizer_states differs"}[rf == f]),
		slog.String("how", "decoded to fp32 and encoded again: the run goes on close to the saved one, not bit for bit"))
	for _, n := range names {
		st := make([][]float32, len(suffixes))
		for k := range st {
			st[k] = make([]float32, numel[n])
		}
		for i := range saved {
			s := &saved[i]
			p := s.parts[n]
			if p[1] == p[0] {
				continue
			}
			m, enc, err := readSavedStates(ctx, s, n, suffixes, f, p[1]-p[0])
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
	}
	return nil
}

package optimizer

import (
	"context"
	"fmt"

	"github.com/zinfio/zinf/buffers"
)

// EncodedState is one of a tensor's optimizer states as the records store
// it (Options.StateFormat), for checkpoints that keep compressed states
// as they are: restoring them with LoadEncodedStates continues the run
// bit for bit, which decoding to fp32 and encoding again would not (a
// block's absmax is not always a map entry's multiple: the signed map has
// +1 but not -1).
type EncodedState struct {
	// Format is the state's format.
	Format StateFormat
	// Data is the state's elements, little-endian: 4 bytes each (fp32), 2
	// (bfloat16 bits) or 1 (the codes of FormatBlockwise8).
	Data []byte
	// Absmax holds, for FormatBlockwise8, one float32 per block of
	// Blockwise8BlockSize elements counted from the tensor's first
	// element (sub-groups start blocks); nil for the other formats.
	Absmax []float32
}

// Elems returns the number of elements s holds.
func (s EncodedState) Elems() int {
	switch s.Format.Encoding {
	case EncodingBF16:
		return len(s.Data) / 2
	case EncodingBlockwise8:
		return len(s.Data)
	}
	return len(s.Data) / 4
}

// Decode returns s as fp32 values (copied, widened or dequantized).
func (s EncodedState) Decode(k StateKind) ([]float32, error) {
	n := s.Elems()
	out := make([]float32, n)
	switch s.Format.Encoding {
	case EncodingBF16:
		buffers.BFloat16ToFloat32(out, buffers.View[buffers.BFloat16](s.Data))
	case EncodingBlockwise8:
		if len(s.Absmax) != int(s.Format.Blocks(int64(n))) {
			return nil, fmt.Errorf("%w: %d codes need %d absmax, have %d", ErrLength, n, s.Format.Blocks(int64(n)), len(s.Absmax))
		}
		if k < 1 || k > 2 {
			return nil, fmt.Errorf("optimizer: 8-bit state %d: only Adam's exp_avg (1) and exp_avg_sq (2) have maps", k)
		}
		stateMap(int(k)).Dequantize(out, s.Data, s.Absmax)
	default:
		copy(out, buffers.Float32Bytes(s.Data))
	}
	return out, nil
}

// ReadEncodedStates returns copies of a tensor's master weights and of
// its rule's states (Hyper.StateNames order) as the records store them,
// as of the last committed step.
func (o *Optimizer) ReadEncodedStates(ctx context.Context, name string) (master []float32, states []EncodedState, err error) {
	n, f, err := o.elemsFormat(name)
	if err != nil {
		return nil, nil, &Error{Op: "read-state", Tensor: name, SubGroup: -1, Err: err}
	}
	master = make([]float32, n)
	states = make([]EncodedState, o.width-1)
	per := map[StateEncoding]int{EncodingFP32: 4, EncodingBF16: 2, EncodingBlockwise8: 1}[f.Encoding]
	for k := range states {
		states[k] = EncodedState{Format: f, Data: make([]byte, per*n)}
		if f.Encoding == EncodingBlockwise8 {
			states[k].Absmax = make([]float32, f.Blocks(int64(n)))
		}
	}
	err = o.visitRecords(ctx, name, func(sg *subGroup, rec []float32) error {
		copy(master[sg.off:], sg.lay.array(rec, 0))
		for k := range states {
			s := &states[k]
			switch f.Encoding {
			case EncodingBF16:
				copy(s.Data[2*sg.off:], buffers.AsBytes(sg.lay.stateBF16(rec, k+1)))
			case EncodingBlockwise8:
				codes, absmax := sg.lay.state8(rec, k+1)
				copy(s.Data[sg.off:], codes)
				copy(s.Absmax[sg.off/Blockwise8BlockSize:], absmax)
			default:
				copy(s.Data[4*sg.off:], buffers.AsBytes(sg.lay.array(rec, k+1)))
			}
		}
		return nil
	})
	if err != nil {
		return nil, nil, err
	}
	return master, states, nil
}

// LoadEncodedStates replaces a registered tensor's states with states in
// the optimizer's own format (from ReadEncodedStates, through a
// checkpoint) and sets the step counter, as LoadStates does; the records
// get exactly these bytes. States in another format are refused
// (ErrFormat): decode them (EncodedState.Decode) and use LoadStates.
func (o *Optimizer) LoadEncodedStates(ctx context.Context, name string, master []float32, states []EncodedState, step int) error {
	fail := func(err error) error { return &Error{Op: "load", Tensor: name, SubGroup: -1, Err: err} }
	n, f, err := o.elemsFormat(name)
	if err != nil {
		return fail(err)
	}
	if len(states) != o.width-1 {
		return fail(fmt.Errorf("%w: %s keeps %d states (%v); got %d", ErrLength, o.opts.Hyper.Rule, o.width-1, o.opts.Hyper.StateNames(), len(states)))
	}
	for k, s := range states {
		sf := s.Format
		if sf.Encoding == EncodingBlockwise8 && sf.BlockSize == 0 {
			sf = FormatBlockwise8
		}
		if sf != f {
			return fail(fmt.Errorf("%w: state %s is %s; the optimizer stores %s", ErrFormat, o.opts.Hyper.StateNames()[k], s.Format, f))
		}
		if s.Elems() != n || (f.Encoding == EncodingBlockwise8 && len(s.Absmax) != int(f.Blocks(int64(n)))) {
			return fail(fmt.Errorf("%w: the partition has %d elements (%d blocks); state %s has %d bytes, %d absmax",
				ErrLength, n, f.Blocks(int64(n)), o.opts.Hyper.StateNames()[k], len(s.Data), len(s.Absmax)))
		}
	}
	return o.loadWith(ctx, name, master, step, func(rec []float32, sg *subGroup) {
		for k, s := range states {
			switch f.Encoding {
			case EncodingBF16:
				copy(buffers.AsBytes(sg.lay.stateBF16(rec, k+1)), s.Data[2*sg.off:2*(sg.off+sg.n)])
			case EncodingBlockwise8:
				codes, absmax := sg.lay.state8(rec, k+1)
				copy(codes, s.Data[sg.off:sg.off+sg.n])
				copy(absmax, s.Absmax[sg.off/Blockwise8BlockSize:])
			default:
				copy(sg.lay.array(rec, k+1), buffers.Float32Bytes(s.Data[4*sg.off:4*(sg.off+sg.n)]))
			}
		}
	})
}

// StateFormatOf returns how name's states are stored (Options.StateFormat
// or StateFormatFor; the block size of 8-bit states set), and whether
// name is registered.
func (o *Optimizer) StateFormatOf(name string) (StateFormat, bool) {
	t, ok := o.lookup(name)
	if !ok {
		return StateFormat{}, false
	}
	return t.format.normalized(), true
}

// elemsFormat returns a registered tensor's element count and state
// format (normalized).
func (o *Optimizer) elemsFormat(name string) (int, StateFormat, error) {
	o.opMu.Lock()
	defer o.opMu.Unlock()
	if o.closed {
		return 0, StateFormat{}, ErrClosed
	}
	t, ok := o.lookup(name)
	if !ok {
		return 0, StateFormat{}, ErrNotRegistered
	}
	return t.n, t.format.normalized(), nil
}

// normalized is f with the block size of 8-bit states set.
func (f StateFormat) normalized() StateFormat {
	if f.Encoding == EncodingBlockwise8 && f.BlockSize == 0 {
		f.BlockSize = Blockwise8BlockSize
	}
	return f
}

// KeepFP32 returns a StateFormatFor rule: fp32 states for tensors of fewer
// than minElems elements and for those whose name matches one of patterns
// (MatchName: "*embed*" matches "/token_embed/embeddings"), f for the
// others.
func KeepFP32(f StateFormat, minElems int, patterns []string) func(name string, elems int) StateFormat {
	return func(name string, elems int) StateFormat {
		if elems < minElems {
			return FormatFP32
		}
		for _, p := range patterns {
			if MatchName(p, name) {
				return FormatFP32
			}
		}
		return f
	}
}

// MatchName reports whether name matches pattern, in which '*' stands for
// any run of characters, '/' included (tensor names are paths: GoMLX's
// "/token_embed/embeddings"), '?' for any one character, and every other
// character for itself.
func MatchName(pattern, name string) bool {
	// Iterative wildcard matching with one backtrack point: the last '*'.
	p, n := 0, 0
	star, mark := -1, 0
	for n < len(name) {
		switch {
		case p < len(pattern) && (pattern[p] == '?' || pattern[p] == name[n]) && pattern[p] != '*':
			p++
			n++
		case p < len(pattern) && pattern[p] == '*':
			star, mark = p, n
			p++
		case star >= 0:
			p = star + 1
			mark++
			n = mark
		default:
			return false
		}
	}
	for p < len(pattern) && pattern[p] == '*' {
		p++
	}
	return p == len(pattern)
}

// MinCompressedElems is the fewest elements a tensor needs for compressed
// states under the planner's rule (plan: KeepFP32): bitsandbytes'
// min_8bit_size. Smaller tensors cost little in fp32 and train badly
// compressed.
const MinCompressedElems = 4096

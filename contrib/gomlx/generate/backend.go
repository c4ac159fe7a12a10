package generate

import (
	"fmt"
	"math"

	"github.com/gomlx/compute"
	"github.com/gomlx/compute/dtypes"
	"github.com/gomlx/compute/shapes"
)

// WithKVCacheOps returns backend with DynamicUpdateSlice, the op GoMLX's
// KV cache writes each new token's keys and values with
// (kvcache.KVCache.Update), where the backend lacks it: compute v0.1.2's
// pure-Go backend does, so neither GoMLX's own generate.Generator with a
// KV cache nor the zoo's ForwardLayer with a cache compiles on it. The
// stand-in covers the updates the KV cache makes (one position along one
// axis, at a dynamic index), moving values bit for bit: for float32,
// float64 and bfloat16 two scatters of that position alone (see
// scatterPosition), for other dtypes a Where over an Iota mask. Any other
// update still reports the backend's error. Open and InMemory wrap their
// backend with it.
func WithKVCacheOps(b compute.Backend) compute.Backend {
	if _, ok := b.(*dusBackend); ok {
		return b
	}
	return &dusBackend{Backend: b}
}

// dusBackend forwards to the backend; its buffers are wrapped so that they
// name it as their backend (GoMLX's tensors keep to one backend), and
// unwrapped on their way back.
type dusBackend struct{ compute.Backend }

func (b *dusBackend) Builder(name string) compute.Builder {
	return dusBuilder{Builder: b.Backend.Builder(name), be: b}
}

func (b *dusBackend) wrap(buf compute.Buffer) compute.Buffer {
	if buf == nil {
		return nil
	}
	if w, ok := buf.(*dusBuffer); ok {
		return w
	}
	return &dusBuffer{Buffer: buf, be: b}
}

func unwrapBuf(buf compute.Buffer) compute.Buffer {
	if w, ok := buf.(*dusBuffer); ok {
		return w.Buffer
	}
	return buf
}

func (b *dusBackend) BufferFromFlatData(deviceNum compute.DeviceNum, flat any, shape shapes.Shape) (compute.Buffer, error) {
	buf, err := b.Backend.BufferFromFlatData(deviceNum, flat, shape)
	return b.wrap(buf), err
}

func (b *dusBackend) NewSharedBuffer(deviceNum compute.DeviceNum, shape shapes.Shape) (compute.Buffer, any, error) {
	buf, flat, err := b.Backend.NewSharedBuffer(deviceNum, shape)
	return b.wrap(buf), flat, err
}

type dusBuffer struct {
	compute.Buffer
	be *dusBackend
}

func (b *dusBuffer) Backend() compute.Backend { return b.be }

func (b *dusBuffer) CopyToDevice(deviceNum compute.DeviceNum) (compute.Buffer, error) {
	c, err := b.Buffer.CopyToDevice(deviceNum)
	return b.be.wrap(c), err
}

type dusExecutable struct {
	compute.Executable
	be *dusBackend
}

func (e dusExecutable) Execute(inputs []compute.Buffer, donate []bool, dev compute.DeviceNum) ([]compute.Buffer, error) {
	in := make([]compute.Buffer, len(inputs))
	for i, b := range inputs {
		in[i] = unwrapBuf(b)
	}
	out, err := e.Executable.Execute(in, donate, dev)
	for i := range out {
		out[i] = e.be.wrap(out[i])
	}
	return out, err
}

type dusBuilder struct {
	compute.Builder
	be *dusBackend
}

func (b dusBuilder) Main() compute.Function { return b.wrapFn(b.Builder.Main()) }

func (b dusBuilder) NewFunction(name string) (compute.Function, error) {
	f, err := b.Builder.NewFunction(name)
	return b.wrapFn(f), err
}

func (b dusBuilder) Compile() (compute.Executable, error) {
	e, err := b.Builder.Compile()
	if err != nil {
		return nil, err
	}
	return dusExecutable{Executable: e, be: b.be}, nil
}

type dusFunction struct {
	compute.Function
	be *dusBackend
}

func (b dusBuilder) wrapFn(f compute.Function) compute.Function {
	if f == nil {
		return nil
	}
	if _, ok := f.(dusFunction); ok {
		return f
	}
	return dusFunction{Function: f, be: b.be}
}

func unwrapFn(f compute.Function) compute.Function {
	if w, ok := f.(dusFunction); ok {
		return w.Function
	}
	return f
}

func (f dusFunction) Builder() compute.Builder {
	return dusBuilder{Builder: f.Function.Builder(), be: f.be}
}

func (f dusFunction) Parent() compute.Function {
	return dusBuilder{be: f.be}.wrapFn(f.Function.Parent())
}

func (f dusFunction) Closure() (compute.Function, error) {
	c, err := f.Function.Closure()
	return dusBuilder{be: f.be}.wrapFn(c), err
}

func (f dusFunction) Call(g compute.Function, inputs ...compute.Value) ([]compute.Value, error) {
	return f.Function.Call(unwrapFn(g), inputs...)
}

func (f dusFunction) Sort(comparator compute.Function, axis int, isStable bool, inputs ...compute.Value) ([]compute.Value, error) {
	return f.Function.Sort(unwrapFn(comparator), axis, isStable, inputs...)
}

func (f dusFunction) While(cond, body compute.Function, initialState ...compute.Value) ([]compute.Value, error) {
	return f.Function.While(unwrapFn(cond), unwrapFn(body), initialState...)
}

func (f dusFunction) If(pred compute.Value, t, e compute.Function) ([]compute.Value, error) {
	return f.Function.If(pred, unwrapFn(t), unwrapFn(e))
}

// DynamicUpdateSlice is the backend's, or where it has none, the stand-in
// for an update of one position along one axis.
func (f dusFunction) DynamicUpdateSlice(operand, update compute.Value, start []compute.Value) (compute.Value, error) {
	v, berr := f.Function.DynamicUpdateSlice(operand, update, start)
	if berr == nil {
		return v, nil
	}
	os, err := f.Shape(operand)
	if err != nil {
		return nil, err
	}
	us, err := f.Shape(update)
	if err != nil {
		return nil, err
	}
	if os.Rank() != us.Rank() || len(start) != os.Rank() || os.DType != us.DType {
		return nil, berr
	}
	axis := -1
	for i := range os.Dimensions {
		if os.Dimensions[i] != us.Dimensions[i] {
			if axis >= 0 || us.Dimensions[i] != 1 {
				return nil, fmt.Errorf("%w (zinf's stand-in covers an update of one position along one axis; operand %s, update %s)", berr, os, us)
			}
			axis = i
		}
	}
	if axis < 0 {
		return update, nil
	}
	s := start[axis]
	ss, err := f.Shape(s)
	if err != nil {
		return nil, err
	}
	if ss.DType != dtypes.Int32 {
		if s, err = f.ConvertDType(s, dtypes.Int32); err != nil {
			return nil, err
		}
	}
	// XLA clamps the start so the update fits.
	lo, err := f.Constant([]int32{0})
	if err != nil {
		return nil, err
	}
	hi, err := f.Constant([]int32{int32(os.Dimensions[axis] - 1)})
	if err != nil {
		return nil, err
	}
	if lo, err = f.Reshape(lo); err != nil {
		return nil, err
	}
	if hi, err = f.Reshape(hi); err != nil {
		return nil, err
	}
	if s, err = f.Clamp(lo, s, hi); err != nil {
		return nil, err
	}
	switch os.DType {
	case dtypes.Float32, dtypes.Float64, dtypes.BFloat16:
		return f.scatterPosition(operand, update, s, os, us, axis)
	}
	return f.wherePosition(operand, update, s, os, axis)
}

// scatterPosition writes update (one position along axis of operand) at
// s with two scatters that touch only that position's values, where the
// backend runs them in place on an operand no other op reads (a KV cache's
// chain of updates): a ScatterMax of +Inf, then a ScatterMin of the
// update, min(+Inf, u) = u bit for bit (NaN included). A Where over the
// whole operand per position made a prefill of n positions cost n passes
// over its cache, its graph n full-size masks. The one difference from a
// plain copy: a position holding NaN before the write keeps it (max(NaN,
// +Inf) is NaN); the KV cache writes positions it has not filled, or ones
// a rolling cache overwrites, whose NaN had spread to every later score.
func (f dusFunction) scatterPosition(operand, update, s compute.Value, os, us shapes.Shape, axis int) (compute.Value, error) {
	// The update without its axis of one: the scatter's window covers
	// every other axis whole, and the axis is inserted at the index.
	dims := make([]int, 0, us.Rank()-1)
	window := make([]int, 0, us.Rank()-1)
	for i, d := range us.Dimensions {
		if i != axis {
			dims = append(dims, d)
			window = append(window, len(window))
		}
	}
	u, err := f.Reshape(update, dims...)
	if err != nil {
		return nil, err
	}
	idx, err := f.Reshape(s, 1)
	if err != nil {
		return nil, err
	}
	inf, err := f.Constant([]float32{float32(math.Inf(1))})
	if err != nil {
		return nil, err
	}
	if inf, err = f.Reshape(inf); err != nil {
		return nil, err
	}
	if os.DType != dtypes.Float32 {
		if inf, err = f.ConvertDType(inf, os.DType); err != nil {
			return nil, err
		}
	}
	if inf, err = f.BroadcastInDim(inf, shapes.Make(os.DType, dims...), nil); err != nil {
		return nil, err
	}
	cleared, err := f.ScatterMax(operand, idx, inf, 0, window, []int{axis}, []int{axis}, true, true)
	if err != nil {
		return nil, err
	}
	return f.ScatterMin(cleared, idx, u, 0, window, []int{axis}, []int{axis}, true, true)
}

// wherePosition writes update at s with a Where over an Iota mask and the
// update broadcast along axis, which moves values bit for bit (the dtypes
// the backend's scatters do not combine).
func (f dusFunction) wherePosition(operand, update, s compute.Value, os shapes.Shape, axis int) (compute.Value, error) {
	idx := shapes.Make(dtypes.Int32, os.Dimensions...)
	iota, err := f.Iota(idx, axis)
	if err != nil {
		return nil, err
	}
	sb, err := f.BroadcastInDim(s, idx, nil)
	if err != nil {
		return nil, err
	}
	mask, err := f.Equal(iota, sb)
	if err != nil {
		return nil, err
	}
	all := make([]int, os.Rank())
	for i := range all {
		all[i] = i
	}
	ub, err := f.BroadcastInDim(update, os, all)
	if err != nil {
		return nil, err
	}
	return f.Where(mask, ub, operand)
}

package generate

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	"github.com/zinfio/zinf"
	"github.com/zinfio/zinf/checkpoint"
	"github.com/zinfio/zinf/tensor"
)

// CheckpointWeights reads the weights of a zinf checkpoint (a directory
// SaveCheckpoint or the GoMLX adapter wrote, world size 1; a root of
// step-NNNNNN checkpoints picks the newest): the parameters, named by
// their GoMLX variable paths, tensor by tensor, CRC-checked. Close it when
// Open is done.
func CheckpointWeights(dir string) (*CkptWeights, error) {
	if _, err := os.Stat(filepath.Join(dir, "checkpoint.json")); err != nil {
		// A root of checkpoints: the newest, by the rule --resume uses (a
		// damaged newest one is an error naming it, never passed over for
		// an older one). A directory without checkpoints falls through to
		// OpenRank's error about dir itself.
		latest, lerr := zinf.LatestCheckpoint(dir)
		switch {
		case lerr == nil:
			dir = latest.Dir
		case !errors.Is(lerr, checkpoint.ErrNoCheckpoint):
			return nil, fmt.Errorf("zinf generate: %w", lerr)
		}
	}
	r, err := checkpoint.OpenRank(dir, 0)
	if err != nil {
		return nil, fmt.Errorf("zinf generate: checkpoint %s: %w", dir, err)
	}
	if m := r.Meta(); m.WorldSize != 1 {
		r.Close()
		return nil, fmt.Errorf("zinf generate: checkpoint %s has %d ranks (a world of 1 is supported: each rank holds a partition)", dir, m.WorldSize)
	}
	return &CkptWeights{r: r, Dir: dir}, nil
}

// CkptWeights are a zinf checkpoint's weights (CheckpointWeights).
type CkptWeights struct {
	r   *checkpoint.Reader
	Dir string // the checkpoint read
	buf []byte
}

func (w *CkptWeights) Read(ctx context.Context, v Var, dst []float32) error {
	ti, err := w.r.Tensor(v.Name)
	if err != nil {
		return err
	}
	n := int64(1)
	for _, d := range ti.Shape {
		n *= d
	}
	if n != int64(len(dst)) {
		return fmt.Errorf("the checkpoint's %q has shape %v, the model %s", v.Name, ti.Shape, v.Shape)
	}
	if int64(cap(w.buf)) < ti.Bytes {
		w.buf = make([]byte, ti.Bytes)
	}
	b := w.buf[:ti.Bytes]
	if err := w.r.ReadTensor(ctx, v.Name, b); err != nil {
		return err
	}
	return widen(ti.DType, b, dst)
}

// Locate is where the checkpoint holds v (InPlaceWeights): Open reads it
// there when the layout allows. The checkpoint's CRCs are not checked for
// tensors read in place (zinf ckpt verify checks them).
func (w *CkptWeights) Locate(v Var) (string, int64, tensor.DType, bool) {
	ti, err := w.r.Tensor(v.Name)
	if err != nil || !sameNumel(ti.Shape, v) {
		return "", 0, 0, false
	}
	return filepath.Join(w.r.Meta().RankDir, ti.File), ti.Offset, ti.DType, true
}

func sameNumel(shape []int64, v Var) bool {
	n := int64(1)
	for _, d := range shape {
		n *= d
	}
	return n == int64(v.Numel())
}

// Close closes the checkpoint.
func (w *CkptWeights) Close() error { return w.r.Close() }

// widen converts little-endian values of dtype d to fp32.
func widen(d tensor.DType, b []byte, dst []float32) error {
	if len(b) != d.Size()*len(dst) {
		return fmt.Errorf("%d bytes for %d %s values", len(b), len(dst), d)
	}
	switch d {
	case tensor.Float32:
		for i := range dst {
			dst[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
		}
	case tensor.BFloat16:
		for i := range dst {
			dst[i] = math.Float32frombits(uint32(binary.LittleEndian.Uint16(b[2*i:])) << 16)
		}
	case tensor.Float16:
		for i := range dst {
			dst[i] = halfToFloat(binary.LittleEndian.Uint16(b[2*i:]))
		}
	default:
		return fmt.Errorf("dtype %s", d)
	}
	return nil
}

func halfToFloat(h uint16) float32 {
	sign := uint32(h>>15) << 31
	exp := uint32(h>>10) & 0x1f
	frac := uint32(h) & 0x3ff
	switch {
	case exp == 0 && frac == 0:
		return math.Float32frombits(sign)
	case exp == 0: // subnormal
		f := float32(frac) / 1024 / 16384
		if sign != 0 {
			f = -f
		}
		return f
	case exp == 31:
		return math.Float32frombits(sign | 0xff<<23 | frac<<13)
	}
	return math.Float32frombits(sign | (exp+112)<<23 | frac<<13)
}

// maxHeader bounds a safetensors header (the format's own limit is 100 MB).
const maxHeader = 100 << 20

// stEntry is one tensor of a safetensors file.
type stEntry struct {
	file       string
	dtype      tensor.DType
	shape      []int64
	begin, end int64 // absolute offsets
}

// SafetensorsWeights reads weights from safetensors files (a Hugging Face
// checkpoint's model.safetensors or its shards), tensor by tensor: name
// maps a variable of the model to the name it has in the files, and
// whether the file holds it transposed (a 2-D [out, in] matrix where the
// model has [in, out]). Every header is read and bounded at open; a tensor
// is read when asked for, so the model is never whole in memory. With name
// nil, variables are looked up by their own path.
func SafetensorsWeights(name func(Var) (string, bool), files ...string) (*STWeights, error) {
	w := &STWeights{name: name, entries: map[string]stEntry{}}
	for _, f := range files {
		if err := w.index(f); err != nil {
			return nil, err
		}
	}
	if len(w.entries) == 0 {
		return nil, fmt.Errorf("zinf generate: no tensors in %v", files)
	}
	return w, nil
}

// STWeights are safetensors weights (SafetensorsWeights).
type STWeights struct {
	name    func(Var) (string, bool)
	entries map[string]stEntry
	buf     []byte
}

func (w *STWeights) index(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("zinf generate: %w", err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return err
	}
	var n [8]byte
	if _, err := io.ReadFull(f, n[:]); err != nil {
		return fmt.Errorf("zinf generate: %s: reading the header length: %w", path, err)
	}
	hl := binary.LittleEndian.Uint64(n[:])
	if hl < 2 || hl > maxHeader || int64(hl)+8 > st.Size() {
		return fmt.Errorf("zinf generate: %s: header length %d (allowed: 2..%d, within the file's %d bytes)", path, hl, maxHeader, st.Size())
	}
	h := make([]byte, hl)
	if _, err := io.ReadFull(f, h); err != nil {
		return fmt.Errorf("zinf generate: %s: reading the header: %w", path, err)
	}
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(h, &raw); err != nil {
		return fmt.Errorf("zinf generate: %s: header: %w", path, err)
	}
	start := 8 + int64(hl)
	for k, m := range raw {
		if k == "__metadata__" {
			continue
		}
		var e struct {
			DType   string  `json:"dtype"`
			Shape   []int64 `json:"shape"`
			Offsets []int64 `json:"data_offsets"`
		}
		if err := json.Unmarshal(m, &e); err != nil {
			return fmt.Errorf("zinf generate: %s: tensor %q: %w", path, k, err)
		}
		var dt tensor.DType
		switch e.DType {
		case "F32":
			dt = tensor.Float32
		case "BF16":
			dt = tensor.BFloat16
		case "F16":
			dt = tensor.Float16
		default:
			return fmt.Errorf("zinf generate: %s: tensor %q: dtype %q (allowed: F32, BF16, F16)", path, k, e.DType)
		}
		numel := int64(1)
		for _, d := range e.Shape {
			if d < 0 || d > 1<<40 || (d > 0 && numel > (1<<50)/d) {
				return fmt.Errorf("zinf generate: %s: tensor %q: shape %v", path, k, e.Shape)
			}
			numel *= d
		}
		if len(e.Offsets) != 2 || e.Offsets[0] < 0 || e.Offsets[1] < e.Offsets[0] || start+e.Offsets[1] > st.Size() || e.Offsets[1]-e.Offsets[0] != numel*int64(dt.Size()) {
			return fmt.Errorf("zinf generate: %s: tensor %q: data_offsets %v for %d %s values (the file has %d bytes of data)", path, k, e.Offsets, numel, e.DType, st.Size()-start)
		}
		if _, dup := w.entries[k]; dup {
			return fmt.Errorf("zinf generate: tensor %q is in two files (%s and %s)", k, w.entries[k].file, path)
		}
		w.entries[k] = stEntry{file: path, dtype: dt, shape: e.Shape, begin: start + e.Offsets[0], end: start + e.Offsets[1]}
	}
	return nil
}

// Locate is where the files hold v, unless it is stored transposed
// (InPlaceWeights).
func (w *STWeights) Locate(v Var) (string, int64, tensor.DType, bool) {
	name, transposed := v.Name, false
	if w.name != nil {
		name, transposed = w.name(v)
	}
	e, ok := w.entries[name]
	if !ok || transposed || !sameNumel(e.shape, v) {
		return "", 0, 0, false
	}
	return e.file, e.begin, e.dtype, true
}

// Names lists the files' tensors, sorted.
func (w *STWeights) Names() []string {
	out := make([]string, 0, len(w.entries))
	for k := range w.entries {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

func (w *STWeights) Read(_ context.Context, v Var, dst []float32) error {
	name, transposed := v.Name, false
	if w.name != nil {
		name, transposed = w.name(v)
	}
	e, ok := w.entries[name]
	if !ok {
		return fmt.Errorf("no tensor %q in the safetensors files", name)
	}
	numel := int64(1)
	for _, d := range e.shape {
		numel *= d
	}
	if numel != int64(len(dst)) {
		return fmt.Errorf("%q has shape %v (%d values), the model's %q %s", name, e.shape, numel, v.Name, v.Shape)
	}
	if transposed && (len(e.shape) != 2 || v.Shape.Rank() != 2 || e.shape[0] != int64(v.Shape.Dimensions[1])) {
		return fmt.Errorf("%q has shape %v: not the transpose of the model's %q %s", name, e.shape, v.Name, v.Shape)
	}
	n := e.end - e.begin
	if int64(cap(w.buf)) < n {
		w.buf = make([]byte, n)
	}
	b := w.buf[:n]
	f, err := os.Open(e.file)
	if err != nil {
		return err
	}
	defer f.Close()
	if _, err := f.ReadAt(b, e.begin); err != nil {
		return fmt.Errorf("%s: reading %q: %w", e.file, name, err)
	}
	if !transposed {
		return widen(e.dtype, b, dst)
	}
	tmp := make([]float32, len(dst))
	if err := widen(e.dtype, b, tmp); err != nil {
		return err
	}
	rows, cols := int(e.shape[0]), int(e.shape[1])
	for r := range rows {
		for c := range cols {
			dst[c*rows+r] = tmp[r*cols+c]
		}
	}
	return nil
}

// HFNames maps the zoo transformer's variables (architecture Gemma, with
// WithTransposedWeights(true): PyTorch's [out, in] projections) to a
// Hugging Face Gemma/Llama-style checkpoint's tensor names:
// model.embed_tokens.weight, model.layers.N.input_layernorm.weight,
// model.layers.N.self_attn.{q,k,v,o}_proj.weight,
// model.layers.N.{post_attention,pre_feedforward,post_feedforward}_layernorm.weight,
// model.layers.N.mlp.{gate,up,down}_proj.weight, model.norm.weight and
// lm_head.weight (transposed: the zoo's head is [in, out]). A variable
// with no counterpart maps to its own path (and Read reports it missing).
func HFNames(v Var) (string, bool) {
	segs := strings.Split(strings.TrimPrefix(v.Name, "/"), "/")
	for i, sg := range segs { // drop the model's scope, if any
		if sg == "token_embed" || sg == "final_norm" || sg == "output" || strings.HasPrefix(sg, "layer_") {
			segs = segs[i:]
			break
		}
	}
	rest := strings.Join(segs, "/")
	switch rest {
	case "token_embed/embeddings":
		return "model.embed_tokens.weight", false
	case "final_norm/rms_norm/scale":
		return "model.norm.weight", false
	case "output/dense/weights":
		return "lm_head.weight", true
	}
	layer, tail, ok := strings.Cut(rest, "/")
	n, err := strconv.Atoi(strings.TrimPrefix(layer, "layer_"))
	if !ok || err != nil || !strings.HasPrefix(layer, "layer_") {
		return v.Name, false
	}
	p := fmt.Sprintf("model.layers.%d.", n)
	switch tail {
	case "input_norm/rms_norm/scale":
		return p + "input_layernorm.weight", false
	case "post_attention_norm/rms_norm/scale":
		return p + "post_attention_layernorm.weight", false
	case "pre_feedforward_norm/rms_norm/scale":
		return p + "pre_feedforward_layernorm.weight", false
	case "post_feedforward_norm/rms_norm/scale":
		return p + "post_feedforward_layernorm.weight", false
	}
	for zoo, hf := range map[string]string{"query": "q_proj", "key": "k_proj", "value": "v_proj", "output": "o_proj"} {
		if tail == "self_attn/MultiHeadAttention/"+zoo+"/dense/weights" {
			return p + "self_attn." + hf + ".weight", false
		}
	}
	for _, proj := range []string{"gate_proj", "up_proj", "down_proj"} {
		if tail == "mlp/"+proj+"/dense/weights" {
			return p + "mlp." + proj + ".weight", false
		}
	}
	return v.Name, false
}

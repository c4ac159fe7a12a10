package generate

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/zinfio/zinf"
	"github.com/zinfio/zinf/checkpoint"
	"github.com/zinfio/zinf/regfile"
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
	if err := notRegularIn(dir); err != nil {
		return nil, err
	}
	r, err := checkpoint.OpenRank(dir, 0)
	if err != nil {
		return nil, fmt.Errorf("zinf generate: checkpoint %s: %w", dir, err)
	}
	if m := r.Meta(); m.WorldSize != 1 {
		r.Close()
		return nil, fmt.Errorf("zinf generate: checkpoint %s has %d ranks (a world of 1 is supported: each rank holds a partition)", dir, m.WorldSize)
	}
	w := &CkptWeights{r: r, Dir: dir, params: r.Names()}
	var ps []string
	for _, ti := range r.Tensors() {
		if ti.File == zinf.CheckpointParamsFile {
			ps = append(ps, ti.Name)
		}
	}
	if len(ps) > 0 { // else every tensor is a parameter
		slices.Sort(ps)
		w.params = ps
	}
	// The parameters are read in place (Locate) by the offsets the manifest
	// gives, so the header of their file is checked now, by the rule
	// ReadTensor, zinf ckpt verify and a resume apply: a header that
	// disagrees with the manifest is refused, never read past.
	if err := r.CheckHeaders(context.Background(), w.params...); err != nil {
		r.Close()
		return nil, fmt.Errorf("zinf generate: checkpoint %s: %w", dir, err)
	}
	for _, n := range r.Meta().ModelShape {
		if len(n) != 1 {
			w.recorded = r.Meta().ModelShape // shapes, not the flat default
			break
		}
	}
	return w, nil
}

// notRegularIn names the first file of the checkpoint dir (or its rank
// directories) that is neither a regular file nor a directory: the reader
// refuses such a file without opening it, by its size, and this says why.
func notRegularIn(dir string) error {
	des, err := os.ReadDir(dir)
	if err != nil {
		return nil // the reader's error says it
	}
	for _, de := range des {
		p := filepath.Join(dir, de.Name())
		st, err := os.Stat(p)
		if err != nil {
			continue
		}
		if st.IsDir() && strings.HasPrefix(de.Name(), "rank-") {
			if err := notRegularIn(p); err != nil {
				return err
			}
			continue
		}
		if !st.IsDir() && !st.Mode().IsRegular() {
			return fmt.Errorf("zinf generate: checkpoint %s: %w", dir, &regfile.NotRegularError{Path: p, Kind: regfile.Kind(st.Mode())})
		}
	}
	return nil
}

// CkptWeights are a zinf checkpoint's weights (CheckpointWeights).
type CkptWeights struct {
	r   *checkpoint.Reader
	Dir string // the checkpoint read
	buf []byte
	// params are the checkpoint's parameters (its params file's tensors,
	// or every tensor when it has none), sorted.
	params []string
	// recorded is the model shape saved with the checkpoint, when it
	// records shapes (zinf.CheckpointMeta.ModelShape; a checkpoint saved
	// without one records every parameter flat: nil here).
	recorded map[string][]int64
	nonFinite
}

// shapeOf is the shape the checkpoint gives ti, and whether it is the
// shape (exact) or only a size: the recorded model shape when there is
// one, else the tensor's own when it has other than one dimension (a
// tensor [n] may be a flat partition of any shape).
func (w *CkptWeights) shapeOf(ti checkpoint.TensorInfo) ([]int64, bool) {
	if s, ok := w.recorded[ti.Name]; ok {
		return s, true
	}
	return ti.Shape, len(ti.Shape) != 1
}

// fits says whether the checkpoint's ti is v's, and why not.
func (w *CkptWeights) fits(ti checkpoint.TensorInfo, v Var) error {
	s, exact := w.shapeOf(ti)
	if exact && !slices.Equal(s, dims(v)) || !exact && numel(s) != int64(v.Numel()) {
		return fmt.Errorf("the checkpoint's %q has shape %v, the model's %v", v.Name, s, dims(v))
	}
	if numel(ti.Shape) != int64(v.Numel()) {
		return fmt.Errorf("the checkpoint's %q holds %d values (shape %v), the model's %v %d", v.Name, numel(ti.Shape), ti.Shape, dims(v), v.Numel())
	}
	return nil
}

// CheckModel checks, before anything is read, that the checkpoint holds
// exactly the model's variables (ModelChecker): each one, with the
// model's shape (the recorded model shape's, when the checkpoint has
// one), and no parameter the model does not have.
func (w *CkptWeights) CheckModel(vars []Var) error {
	var missing, shapes []string
	model := make(map[string]bool, len(vars))
	for _, v := range vars {
		model[v.Name] = true
		ti, err := w.r.Tensor(v.Name)
		if err != nil {
			missing = append(missing, fmt.Sprintf("%s %v", v.Name, dims(v)))
			continue
		}
		if err := w.fits(ti, v); err != nil {
			shapes = append(shapes, err.Error())
		}
	}
	var extra []string
	for _, n := range w.params {
		if !model[n] {
			extra = append(extra, n)
		}
	}
	for n := range w.recorded {
		if !model[n] && !slices.Contains(w.params, n) {
			extra = append(extra, n)
		}
	}
	return modelErr("the checkpoint "+w.Dir, missing, extra, shapes)
}

// ErrWrongModel is wrapped by ModelChecker's errors: the weights are not
// the model's.
var ErrWrongModel = errors.New("the weights are not the model's")

// modelErr says how weights (what) differ from the model, or nil.
func modelErr(what string, missing, extra, shapes []string) error {
	var errs []error
	if len(shapes) > 0 {
		errs = append(errs, fmt.Errorf("zinf generate: %s: not the model's shapes: %s", what, list(shapes)))
	}
	if len(extra) > 0 {
		slices.Sort(extra)
		errs = append(errs, fmt.Errorf("zinf generate: %s: %s the model does not have (another model: check its hyperparameters): %s", what, count(len(extra), "tensor"), list(extra)))
	}
	if len(missing) > 0 {
		slices.Sort(missing)
		errs = append(errs, fmt.Errorf("zinf generate: %s: %d of the model's variables missing: %s", what, len(missing), list(missing)))
	}
	if len(errs) == 0 {
		return nil
	}
	return wrongModel{errors.Join(errs...)}
}

// wrongModel is modelErr's error: it reads as its findings and matches
// ErrWrongModel.
type wrongModel struct{ error }

func (e wrongModel) Unwrap() error        { return e.error }
func (e wrongModel) Is(target error) bool { return target == ErrWrongModel }

// count writes n things.
func count(n int, thing string) string {
	if n == 1 {
		return "1 " + thing
	}
	return fmt.Sprintf("%d %ss", n, thing)
}

// list writes up to 16 items, then how many more.
func list(items []string) string {
	const most = 16
	if len(items) <= most {
		return strings.Join(items, "; ")
	}
	return fmt.Sprintf("%s; and %d more", strings.Join(items[:most], "; "), len(items)-most)
}

func dims(v Var) []int64 {
	out := make([]int64, v.Shape.Rank())
	for i, d := range v.Shape.Dimensions {
		out[i] = int64(d)
	}
	return out
}

func numel(shape []int64) int64 {
	n := int64(1)
	for _, d := range shape {
		n *= d
	}
	return n
}

func (w *CkptWeights) Read(ctx context.Context, v Var, dst []float32) error {
	ti, err := w.r.Tensor(v.Name)
	if err != nil {
		return err
	}
	if int64(len(dst)) != int64(v.Numel()) {
		return fmt.Errorf("%d values for the model's %q %v", len(dst), v.Name, dims(v))
	}
	if err := w.fits(ti, v); err != nil {
		return err
	}
	if int64(cap(w.buf)) < ti.Bytes {
		w.buf = make([]byte, ti.Bytes)
	}
	b := w.buf[:ti.Bytes]
	if err := w.r.ReadTensor(ctx, v.Name, b); err != nil {
		return err
	}
	if err := widen(ti.DType, b, dst); err != nil {
		return err
	}
	w.count(v.Name, dst)
	return nil
}

// Locate is where the checkpoint holds v (InPlaceWeights): Open reads it
// there when the layout allows. The checkpoint's CRCs are not checked for
// tensors read in place (zinf ckpt verify checks them); their file's
// header was checked against the manifest by CheckpointWeights.
func (w *CkptWeights) Locate(v Var) (string, int64, tensor.DType, bool) {
	ti, err := w.r.Tensor(v.Name)
	if err != nil || w.fits(ti, v) != nil {
		return "", 0, 0, false
	}
	return filepath.Join(w.r.Meta().RankDir, ti.File), ti.Offset, ti.DType, true
}

// Close closes the checkpoint.
func (w *CkptWeights) Close() error { return w.r.Close() }

// ModelChecker is implemented by Weights that can check, before any
// tensor is read, that they are the model's: Open and OpenMapped call
// CheckModel with the model's variables, and refuse the weights when it
// fails (a tensor of another shape, a tensor the model does not have, a
// variable the weights lack), naming them.
type ModelChecker interface {
	CheckModel(vars []Var) error
}

// nonFinite counts the NaN and infinite values of the tensors Read
// widened (a count made while the values are converted anyway: tensors
// read in place are not scanned, which would cost a pass over them).
type nonFinite struct {
	counts map[string]int
}

func (n *nonFinite) count(name string, vals []float32) {
	c := 0
	for _, x := range vals {
		if x-x != 0 { // NaN or ±Inf
			c++
		}
	}
	if c > 0 {
		if n.counts == nil {
			n.counts = map[string]int{}
		}
		n.counts[name] = c
	}
}

// NonFinite returns, for each tensor Read converted that holds NaN or
// infinite values, how many: a model with them generates what its
// arithmetic makes of them (GoMLX's in-memory generation would too), so
// a caller may warn. Tensors read in place are not scanned.
func (n *nonFinite) NonFinite() map[string]int { return n.counts }

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
	w := &STWeights{name: name, entries: map[string]stEntry{}, files: files}
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
	name      func(Var) (string, bool)
	entries   map[string]stEntry
	nameBytes int64 // the entries' names together (maxNamesBytes)
	files     []string
	buf       []byte
	nonFinite
}

func (w *STWeights) index(path string) error {
	f, st, err := regfile.Open(path)
	if err != nil {
		return fmt.Errorf("zinf generate: %w", err)
	}
	defer f.Close()
	var n [8]byte
	if _, err := io.ReadFull(f, n[:]); err != nil {
		return fmt.Errorf("zinf generate: %s: reading the header length: %w", path, err)
	}
	hl := binary.LittleEndian.Uint64(n[:])
	if hl < 2 || hl > maxHeader || int64(hl)+8 > st.Size() {
		return fmt.Errorf("zinf generate: %s: header length %d (allowed: 2..%d, within the file's %d bytes)", path, hl, maxHeader, st.Size())
	}
	start := 8 + int64(hl)
	return w.readHeader(path, f, int64(hl), start, st.Size()-start)
}

// lookup is where the files hold v: the entry, its name in the files and
// whether it is stored transposed.
func (w *STWeights) lookup(v Var) (stEntry, string, bool, bool) {
	name, transposed := v.Name, false
	if w.name != nil {
		name, transposed = w.name(v)
	}
	e, ok := w.entries[name]
	return e, name, transposed, ok
}

// fits says whether e, named name in the files, is v's: of v's shape, or
// of its transpose when stored transposed. A tensor of another shape with
// as many values is refused: its bytes would be reinterpreted.
func fits(e stEntry, name string, transposed bool, v Var) error {
	want := dims(v)
	if transposed {
		if len(want) != 2 {
			return fmt.Errorf("%q is stored transposed, but the model's %q has shape %v (2-D only)", name, v.Name, want)
		}
		want = []int64{want[1], want[0]}
		if !slices.Equal(e.shape, want) {
			return fmt.Errorf("%q has shape %v, the transpose of the model's %q %v is %v", name, e.shape, v.Name, dims(v), want)
		}
		return nil
	}
	if !slices.Equal(e.shape, want) {
		if name != v.Name {
			return fmt.Errorf("%q has shape %v, the model's %q %v", name, e.shape, v.Name, want)
		}
		return fmt.Errorf("%q has shape %v, the model's %v", name, e.shape, want)
	}
	return nil
}

// CheckModel checks, before anything is read, that the files hold exactly
// the model's variables (ModelChecker): each one, with the model's shape
// (its transpose where the names say it is stored transposed), and no
// tensor the model does not have; of a Hugging Face file (HFNames), the
// rotary embeddings' inv_freq buffers some hold are not weights, and are
// ignored.
func (w *STWeights) CheckModel(vars []Var) error {
	var missing, shapes []string
	used := make(map[string]bool, len(vars))
	for _, v := range vars {
		e, name, transposed, ok := w.lookup(v)
		if !ok {
			if name != v.Name {
				missing = append(missing, fmt.Sprintf("%s %v (as %s)", v.Name, dims(v), name))
			} else {
				missing = append(missing, fmt.Sprintf("%s %v", v.Name, dims(v)))
			}
			continue
		}
		used[name] = true
		if err := fits(e, name, transposed, v); err != nil {
			shapes = append(shapes, err.Error())
		}
	}
	var extra []string
	for n, e := range w.entries {
		if used[n] || w.name != nil && strings.HasSuffix(n, ".rotary_emb.inv_freq") {
			continue
		}
		extra = append(extra, fmt.Sprintf("%s %v", n, e.shape))
	}
	return modelErr("the safetensors files "+strings.Join(w.files, ", "), missing, extra, shapes)
}

// Locate is where the files hold v, unless it is stored transposed or has
// another shape (InPlaceWeights).
func (w *STWeights) Locate(v Var) (string, int64, tensor.DType, bool) {
	e, name, transposed, ok := w.lookup(v)
	if !ok || transposed || fits(e, name, false, v) != nil {
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
	e, name, transposed, ok := w.lookup(v)
	if !ok {
		return fmt.Errorf("no tensor %q in the safetensors files", name)
	}
	if len(dst) != v.Numel() {
		return fmt.Errorf("%d values for the model's %q %v", len(dst), v.Name, dims(v))
	}
	if err := fits(e, name, transposed, v); err != nil {
		return err
	}
	n := e.end - e.begin
	if int64(cap(w.buf)) < n {
		w.buf = make([]byte, n)
	}
	b := w.buf[:n]
	// Opened again by the rule index applied: the path may name another
	// file by now.
	f, _, err := regfile.Open(e.file)
	if err != nil {
		return err
	}
	defer f.Close()
	if _, err := f.ReadAt(b, e.begin); err != nil {
		return fmt.Errorf("%s: reading %q: %w", e.file, name, err)
	}
	if !transposed {
		if err := widen(e.dtype, b, dst); err != nil {
			return err
		}
		w.count(v.Name, dst)
		return nil
	}
	tmp := make([]float32, len(dst))
	if err := widen(e.dtype, b, tmp); err != nil {
		return err
	}
	w.count(v.Name, tmp)
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

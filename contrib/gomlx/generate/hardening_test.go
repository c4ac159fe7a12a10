package generate_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/gomlx/compute/dtypes"

	"github.com/zinfio/zinf"
	"github.com/zinfio/zinf/checkpoint"
	"github.com/zinfio/zinf/contrib/gomlx/generate"
	"github.com/zinfio/zinf/tensor"
)

// stTensor is one tensor of a safetensors file a test writes.
type stTensor struct {
	name  string
	shape []int64
	vals  []float32 // F32; nil: zeros
}

// writeST writes tensors as an F32 safetensors file, back to back in
// order, and returns its path.
func writeST(t *testing.T, dir, name string, ts []stTensor) string {
	t.Helper()
	var hdr bytes.Buffer
	hdr.WriteString(`{"__metadata__":{"format":"pt"}`)
	var data []byte
	for _, x := range ts {
		n := int64(1)
		for _, d := range x.shape {
			n *= d
		}
		begin := len(data)
		for i := range n {
			v := float32(0)
			if x.vals != nil {
				v = x.vals[i]
			}
			data = binary.LittleEndian.AppendUint32(data, math.Float32bits(v))
		}
		sh, _ := json.Marshal(x.shape)
		fmt.Fprintf(&hdr, `,%q:{"dtype":"F32","shape":%s,"data_offsets":[%d,%d]}`, x.name, sh, begin, len(data))
	}
	hdr.WriteString("}")
	return writeRaw(t, dir, name, hdr.String(), data)
}

// writeRaw writes a safetensors file of header (padded to 8 bytes) and
// data.
func writeRaw(t *testing.T, dir, name, header string, data []byte) string {
	t.Helper()
	for len(header)%8 != 0 {
		header += " "
	}
	out := binary.LittleEndian.AppendUint64(nil, uint64(len(header)))
	out = append(append(out, header...), data...)
	path := filepath.Join(dir, name)
	if err := os.WriteFile(path, out, 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

func int64s(d []int) []int64 {
	out := make([]int64, len(d))
	for i, x := range d {
		out[i] = int64(x)
	}
	return out
}

// modelTensors are fn's variables as safetensors tensors of their own
// shapes, by their own paths (as --make-model names them).
func modelTensors(t *testing.T, fn generate.ModelFn) ([]generate.Var, []stTensor) {
	t.Helper()
	vars, err := generate.ModelVars(backend(t), fn)
	if err != nil {
		t.Fatal(err)
	}
	ts := make([]stTensor, len(vars))
	for i, v := range vars {
		ts[i] = stTensor{name: v.Name, shape: int64s(v.Shape.Dimensions)}
	}
	return vars, ts
}

// TestSafetensorsOtherShapeRefused: a tensor of another shape with the
// model's element count (the matrix flat, or its dimensions swapped) is
// refused by Open and OpenMapped naming the tensor and both shapes; its
// bytes were reinterpreted before.
func TestSafetensorsOtherShapeRefused(t *testing.T) {
	ctx := watchdog(t, 3*time.Minute)
	be := backend(t)
	fn := tiny(dtypes.Float32, 1)
	vars, ts := modelTensors(t, fn)
	mat := -1
	for i, v := range vars {
		if d := v.Shape.Dimensions; len(d) == 2 && d[0] != d[1] {
			mat = i
			break
		}
	}
	if mat < 0 {
		t.Fatal("no non-square matrix in the model")
	}
	d := ts[mat].shape
	for _, other := range [][]int64{{d[1], d[0]}, {d[0] * d[1]}} {
		bad := append([]stTensor(nil), ts...)
		bad[mat] = stTensor{name: ts[mat].name, shape: other}
		path := writeST(t, t.TempDir(), "m.safetensors", bad)
		w, err := generate.SafetensorsWeights(nil, path)
		if err != nil {
			t.Fatal(err)
		}
		want := []string{vars[mat].Name, fmt.Sprint(other), fmt.Sprint(d)}
		g, err := generate.Open(ctx, be, nvmeConfig(t, 4<<20, false), fn, w, generate.Options{Logger: quiet, NoBandwidthProbe: true})
		if err == nil {
			g.Close()
			t.Fatalf("Open took %v for %v", other, d)
		}
		for _, s := range want {
			if !strings.Contains(err.Error(), s) || !errors.Is(err, generate.ErrWrongModel) {
				t.Errorf("Open's error lacks %q (or ErrWrongModel): %v", s, err)
			}
		}
		if g, err := generate.OpenMapped(ctx, be, fn, generate.MappedOptions{}, path); err == nil {
			g.Close()
			t.Fatalf("OpenMapped took %v for %v", other, d)
		} else if !strings.Contains(err.Error(), fmt.Sprint(other)) {
			t.Errorf("OpenMapped's error lacks the shape %v: %v", other, err)
		}
		// Read alone (no CheckModel) refuses it too.
		if err := w.Read(ctx, vars[mat], make([]float32, vars[mat].Numel())); err == nil || !strings.Contains(err.Error(), fmt.Sprint(other)) {
			t.Errorf("Read: %v", err)
		}
	}
}

// TestSafetensorsExtraTensorsRefused: a file holding tensors the model
// does not have (a model with biases read as one without) is refused,
// naming them; one lacking a variable names it.
func TestSafetensorsExtraTensorsRefused(t *testing.T) {
	ctx := watchdog(t, 3*time.Minute)
	be := backend(t)
	fn := tiny(dtypes.Float32, 1)
	_, ts := modelTensors(t, fn)
	extra := append(append([]stTensor(nil), ts...), stTensor{name: "/transformer/layer_0/ffn/bias", shape: []int64{48}}, stTensor{name: "/transformer/output/bias", shape: []int64{97}})
	path := writeST(t, t.TempDir(), "m.safetensors", extra)
	w, err := generate.SafetensorsWeights(nil, path)
	if err != nil {
		t.Fatal(err)
	}
	if g, err := generate.Open(ctx, be, nvmeConfig(t, 4<<20, false), fn, w, generate.Options{Logger: quiet, NoBandwidthProbe: true}); err == nil {
		g.Close()
		t.Fatal("Open took a file with 2 tensors the model does not have")
	} else if !strings.Contains(err.Error(), "2 tensors the model does not have") || !strings.Contains(err.Error(), "/transformer/output/bias [97]") {
		t.Errorf("Open: %v", err)
	}
	short := writeST(t, t.TempDir(), "m.safetensors", ts[1:])
	if w, err = generate.SafetensorsWeights(nil, short); err != nil {
		t.Fatal(err)
	}
	if g, err := generate.OpenMapped(ctx, be, fn, generate.MappedOptions{}, short); err == nil {
		g.Close()
		t.Fatal("OpenMapped took a file lacking a variable")
	} else if !strings.Contains(err.Error(), "1 of the model's variables missing: "+ts[0].name) {
		t.Errorf("OpenMapped: %v", err)
	}
}

// saveCkpt saves a checkpoint of vars (their own shapes, or flat with the
// model shape recorded as the GoMLX adapter saves them) and returns its
// directory.
func saveCkpt(t *testing.T, ctx context.Context, vars []generate.Var, flat bool) string {
	t.Helper()
	var ts []checkpoint.Tensor
	shapes := map[string][]int64{}
	for _, v := range vars {
		shape := int64s(v.Shape.Dimensions)
		shapes[v.Name] = shape
		if flat {
			shape = []int64{int64(v.Numel())}
		}
		ts = append(ts, checkpoint.FromBytes(v.Name, tensor.Float32, shape, make([]byte, 4*v.Numel())))
	}
	st := checkpoint.State{Step: 1, Ranks: []checkpoint.RankState{{Rank: 0, Files: []checkpoint.TensorFile{{Name: zinf.CheckpointParamsFile, Tensors: ts}}}}}
	if flat {
		st.ModelShape = shapes
	}
	dir := filepath.Join(t.TempDir(), "ckpt")
	if _, err := checkpoint.Save(ctx, dir, st, checkpoint.SaveOptions{}); err != nil {
		t.Fatal(err)
	}
	return dir
}

// TestCheckpointOfAnotherModelRefused: a checkpoint of a model with
// biases, opened for the model without them, is refused naming the
// tensors the model does not have (it generated before, ignoring them);
// a recorded model shape that differs is refused naming both shapes.
func TestCheckpointOfAnotherModelRefused(t *testing.T) {
	ctx := watchdog(t, 3*time.Minute)
	be := backend(t)
	fn := tiny(dtypes.Float32, 1)
	vars, err := generate.ModelVars(be, fn)
	if err != nil {
		t.Fatal(err)
	}
	biased := append([]generate.Var(nil), vars...)
	for _, v := range vars {
		if v.Shape.Rank() == 2 {
			b := v
			b.Name = strings.TrimSuffix(v.Name, "weights") + "biases"
			b.Shape.Dimensions = []int{v.Shape.Dimensions[1]}
			biased = append(biased, b)
		}
	}
	nb := len(biased) - len(vars)
	for _, flat := range []bool{false, true} {
		dir := saveCkpt(t, ctx, biased, flat)
		w, err := generate.CheckpointWeights(dir)
		if err != nil {
			t.Fatal(err)
		}
		g, err := generate.Open(ctx, be, nvmeConfig(t, 4<<20, false), fn, w, generate.Options{Logger: quiet, NoBandwidthProbe: true})
		w.Close()
		if err == nil {
			g.Close()
			t.Fatalf("flat %v: Open generated from a checkpoint with %d tensors the model does not have", flat, nb)
		}
		if want := fmt.Sprintf("%d tensors the model does not have", nb); !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), "biases") {
			t.Errorf("flat %v: %v (want %q)", flat, err, want)
		}
	}
	// The recorded model shape of one matrix, transposed.
	other := append([]generate.Var(nil), vars...)
	mat := -1
	for i, v := range other {
		if d := v.Shape.Dimensions; len(d) == 2 && d[0] != d[1] {
			other[i].Shape = v.Shape.Clone()
			other[i].Shape.Dimensions = []int{d[1], d[0]}
			mat = i
			break
		}
	}
	w, err := generate.CheckpointWeights(saveCkpt(t, ctx, other, true))
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	err = w.CheckModel(vars)
	want := fmt.Sprintf("%q has shape %v, the model's %v", vars[mat].Name, int64s(other[mat].Shape.Dimensions), int64s(vars[mat].Shape.Dimensions))
	if err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("CheckModel: %v (want %s)", err, want)
	}
	if _, _, _, ok := w.Locate(vars[mat]); ok {
		t.Error("Locate gave a tensor of another recorded shape")
	}
}

// TestCheckpointHeaderDisagreesWithManifest: a checkpoint whose
// params.safetensors header has one shape digit changed is refused, as
// zinf ckpt verify and a resume refuse it, naming the header and the
// manifest (it generated before: the tensors are read in place, by the
// manifest's offsets, never through the header check).
func TestCheckpointHeaderDisagreesWithManifest(t *testing.T) {
	ctx := watchdog(t, 3*time.Minute)
	vars, err := generate.ModelVars(backend(t), tiny(dtypes.Float32, 1))
	if err != nil {
		t.Fatal(err)
	}
	dir := saveCkpt(t, ctx, vars, false)
	path := filepath.Join(dir, "rank-00000", zinf.CheckpointParamsFile)
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	i := bytes.Index(b, []byte(`"shape":[97,`))
	if i < 0 {
		t.Fatalf("no [97, ...] shape in the header: %.300s", b[8:])
	}
	b[i+len(`"shape":[9`)] = '6'
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := checkpoint.Verify(ctx, dir); err == nil {
		t.Fatal("checkpoint.Verify took the changed header: the test's damage is not damage")
	}
	w, err := generate.CheckpointWeights(dir)
	if err == nil {
		w.Close()
		t.Fatal("CheckpointWeights took a header that disagrees with the manifest")
	}
	if !errors.Is(err, checkpoint.ErrCorrupt) || !strings.Contains(err.Error(), "safetensors header of params.safetensors") || !strings.Contains(err.Error(), "manifest") {
		t.Fatalf("error: %v", err)
	}
}

// TestSafetensorsFormatRules: what the format's own validator refuses is
// refused, naming the tensor or the offsets: a name given twice, tensors
// that overlap or share bytes, a hole, trailing bytes, metadata that is
// not strings, text after the JSON; the files --make-model and the
// checkpoint writer make pass.
func TestSafetensorsFormatRules(t *testing.T) {
	ctx := watchdog(t, 3*time.Minute)
	dir := t.TempDir()
	d8 := make([]byte, 8)
	for _, c := range []struct {
		name, header string
		data         []byte
		want         string
	}{
		{"dup", `{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}`, d8, `"a" appears twice`},
		{"dupmeta", `{"__metadata__":{},"__metadata__":{},"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}`, d8, `"__metadata__" appears twice`},
		{"shared", `{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}`, d8, `overlaps "a"`},
		{"overlap", `{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}`, d8, `tensor "b" at data offsets [4, 8] overlaps "a", which ends at 8`},
		{"hole", `{"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}`, d8, `tensor "a" begins at data offset 4, the data section's start ends at 0: a hole of 4 bytes`},
		{"trailing", `{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}`, d8, `4 trailing bytes`},
		{"meta", `{"__metadata__":{"n":1},"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}`, d8, "__metadata__"},
		{"after", `{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}} x`, d8, `'x' after the JSON object`},
		{"unterminated", `{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}`, d8, "ends inside"},
		{"offsets", `{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8,9]}}`, d8, "data_offsets: more than 2 values"},
		{"negative", `{"a":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}}`, d8, "shape"},
		{"rank", `{"a":{"dtype":"F32","shape":[1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1],"data_offsets":[0,4]}}`, d8[:4], "more than 16 values"},
	} {
		path := writeRaw(t, dir, c.name+".safetensors", c.header, c.data)
		_, err := generate.SafetensorsWeights(nil, path)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v (want %q)", c.name, err, c.want)
		}
	}
	// Legitimate files: escapes in names and metadata, a zero-size tensor,
	// unknown fields skipped, the header padded with spaces.
	ok := writeRaw(t, dir, "ok.safetensors", `{"__metadata__":{"k\"\u00e9":"v\\"},"a\/b":{"dtype":"F32","shape":[2],"data_offsets":[0,8],"x":[{"y":null}]},"z":{"dtype":"F16","shape":[0],"data_offsets":[8,8]}}`, d8)
	w, err := generate.SafetensorsWeights(nil, ok)
	if err != nil {
		t.Fatal(err)
	}
	if n := w.Names(); len(n) != 2 || n[0] != "a/b" {
		t.Fatalf("names %q", n)
	}
	made := filepath.Join(dir, "made.safetensors")
	if _, err := generate.WriteRandomModel(ctx, backend(t), tiny(dtypes.BFloat16, 2), made, 1); err != nil {
		t.Fatal(err)
	}
	if _, err := generate.SafetensorsWeights(nil, made); err != nil {
		t.Errorf("--make-model's file: %v", err)
	}
	vars, err := generate.ModelVars(backend(t), tiny(dtypes.Float32, 1))
	if err != nil {
		t.Fatal(err)
	}
	ck := saveCkpt(t, ctx, vars, true)
	if _, err := generate.SafetensorsWeights(nil, filepath.Join(ck, "rank-00000", zinf.CheckpointParamsFile)); err != nil {
		t.Errorf("the checkpoint writer's file: %v", err)
	}
}

// TestSafetensorsHeaderMemoryBounded: a header under the format's 100 MB
// limit costs a bounded amount of memory whatever it holds: a million
// zero-size entries (68 MB; 610 MiB of RSS before) are refused past the
// tensor bound, and 100 MB of __metadata__ (231 MiB before) is skipped,
// never held. Allocations are measured (TotalAlloc), with generous bounds.
func TestSafetensorsHeaderMemoryBounded(t *testing.T) {
	if testing.Short() {
		t.Skip("writes 170 MB")
	}
	dir := t.TempDir()
	var hb strings.Builder
	hb.WriteString(`{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}`)
	for i := range 1_000_000 {
		fmt.Fprintf(&hb, `,"t%07d":{"dtype":"F32","shape":[0],"data_offsets":[8,8]}`, i)
	}
	hb.WriteString("}")
	many := writeRaw(t, dir, "many.safetensors", hb.String(), make([]byte, 8))
	meta := writeRaw(t, dir, "meta.safetensors", `{"__metadata__":{"k":"`+strings.Repeat("x", 100_000_000-100)+`"},"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}`, make([]byte, 8))
	hb.Reset()
	for _, c := range []struct {
		path, want string
		bound      uint64
	}{
		{many, "more than 262144 tensors", 256 << 20},
		{meta, "", 16 << 20},
	} {
		runtime.GC()
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		w, err := generate.SafetensorsWeights(nil, c.path)
		runtime.ReadMemStats(&after)
		if c.want == "" && err != nil || c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)) {
			t.Errorf("%s: %v (want %q)", filepath.Base(c.path), err, c.want)
		}
		_ = w
		got := after.TotalAlloc - before.TotalAlloc
		t.Logf("%s: %.1f MiB allocated", filepath.Base(c.path), float64(got)/(1<<20))
		if got > c.bound {
			t.Errorf("%s: parsing the header allocated %.1f MiB (bound %.0f MiB)", filepath.Base(c.path), float64(got)/(1<<20), float64(c.bound)/(1<<20))
		}
	}
}

// TestNonFiniteWeightsCounted: NaN and infinite values in a tensor Read
// converts are counted (for the command's warning).
func TestNonFiniteWeightsCounted(t *testing.T) {
	ctx := watchdog(t, time.Minute)
	vars, ts := modelTensors(t, tiny(dtypes.Float32, 1))
	vals := make([]float32, vars[0].Numel())
	vals[1], vals[5], vals[7] = float32(math.NaN()), float32(math.Inf(1)), float32(math.Inf(-1))
	ts[0].vals = vals
	w, err := generate.SafetensorsWeights(nil, writeST(t, t.TempDir(), "m.safetensors", ts))
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range vars[:2] {
		if err := w.Read(ctx, v, make([]float32, v.Numel())); err != nil {
			t.Fatal(err)
		}
	}
	if nf := w.NonFinite(); len(nf) != 1 || nf[vars[0].Name] != 3 {
		t.Fatalf("NonFinite() = %v, want %s: 3", nf, vars[0].Name)
	}
}

// FuzzSafetensorsHeader: no header makes the reader panic or take a
// tensor outside the file.
func FuzzSafetensorsHeader(f *testing.F) {
	f.Add(`{"__metadata__":{"format":"pt"},"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}`, 8)
	f.Add(`{"a":{"dtype":"BF16","shape":[2,2],"data_offsets":[0,8],"x":[1,{"y":"\u00e9"}]},"b":{"dtype":"F16","shape":[0],"data_offsets":[8,8]}}`, 8)
	f.Add(`{"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}} `, 8)
	dir := f.TempDir()
	f.Fuzz(func(t *testing.T, header string, data int) {
		if data < 0 || data > 1<<12 || len(header) > 1<<12 {
			return
		}
		path := writeRaw(t, dir, "f.safetensors", header, make([]byte, data))
		w, err := generate.SafetensorsWeights(nil, path)
		if err != nil {
			return
		}
		if len(w.Names()) == 0 {
			t.Fatal("no tensors, no error")
		}
	})
}

package generate_test

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/gomlx/compute"
	"github.com/gomlx/compute/dtypes"
	"github.com/gomlx/gomlx/ml/layers/activation"
	"github.com/gomlx/gomlx/ml/model"
	"github.com/gomlx/gomlx/ml/zoo/transformer"

	"github.com/zinfio/zinf/contrib/gomlx/generate"
)

// TestMappedEqualsZinf: a model WriteRandomModel wrote generates the same
// greedy tokens through zinf (every weight read in place from the file by
// O_DIRECT, streamed through the pinned pool), from the file mapped into
// memory (OpenMapped: plain, MADV_SEQUENTIAL, MADV_WILLNEED one layer
// ahead) and in GoMLX's in-memory generator over the same file.
func TestMappedEqualsZinf(t *testing.T) {
	for _, dt := range []dtypes.DType{dtypes.BFloat16, dtypes.Float32} {
		t.Run(dt.String(), func(t *testing.T) {
			ctx := watchdog(t, 4*time.Minute)
			if dt == dtypes.BFloat16 {
				t.Setenv("GOMLX_FUSION", "false")
			}
			be := backend(t)
			fn := tiny(dt, 3)
			path := filepath.Join(t.TempDir(), "model.safetensors")
			if _, err := generate.WriteRandomModel(ctx, be, fn, path, 5); err != nil {
				t.Fatal(err)
			}
			w, err := generate.SafetensorsWeights(nil, path)
			if err != nil {
				t.Fatal(err)
			}
			s := generate.Sampling{MaxNewTokens: 12}
			ps := prompts(2, 4, 97, 3)
			want := reference(ctx, t, be, fn, w, ps, s)
			g, err := generate.Open(ctx, be, nvmeConfig(t, 4<<20, dt == dtypes.BFloat16), fn, w,
				generate.Options{Logger: quiet, NoBandwidthProbe: true, PieceBytes: -1, InPlaceOnly: true})
			if err != nil {
				t.Fatal(err)
			}
			defer g.Close()
			if n, _ := g.InPlace(); n != len(g.Vars()) {
				t.Fatalf("%d of %d tensors read in place", n, len(g.Vars()))
			}
			res, err := g.Generate(ctx, ps, s, nil)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.EqualFunc(res.Tokens, want, slices.Equal) {
				t.Fatalf("through zinf:\n%v\nin memory:\n%v", res.Tokens, want)
			}
			for _, a := range []generate.Advice{generate.AdviceNone, generate.AdviceSequential, generate.AdviceWillNeed} {
				m, mres := generateMapped(ctx, t, be, fn, a, path, ps, s, want)
				if m.Runtime() != nil {
					t.Fatal("a mapped Generator has a zinf runtime")
				}
				// Every pass copies each layer's weights from the mapping
				// (the embedding by rows).
				if min := int64(mres.Steps) * (m.WeightBytes() - 97*32*int64(dt.Size())); mres.BytesRead < min {
					t.Fatalf("mapped (%s): %d bytes taken from the mapping in %d passes, want >= %d", a, mres.BytesRead, mres.Steps, min)
				}
			}
		})
	}
}

// TestHalfWeightsComputedInFloat32: a bf16 model file generates with the
// model built in float32 (each weight widened as its layer is read: the
// fast path of the pure-Go backend, whose float32 matmul is the SIMD one)
// the same greedy tokens through zinf (weights stored bf16, read in place),
// from the mapped file and in GoMLX's in-memory generator over the widened
// weights, and differs from the bf16-computed generation only as bf16
// arithmetic does (the file's weights are the same).
func TestHalfWeightsComputedInFloat32(t *testing.T) {
	ctx := watchdog(t, 4*time.Minute)
	be := backend(t)
	path := filepath.Join(t.TempDir(), "model.safetensors")
	if _, err := generate.WriteRandomModel(ctx, be, tiny(dtypes.BFloat16, 3), path, 5); err != nil {
		t.Fatal(err)
	}
	w, err := generate.SafetensorsWeights(nil, path)
	if err != nil {
		t.Fatal(err)
	}
	fn := tiny(dtypes.Float32, 3)
	s := generate.Sampling{MaxNewTokens: 12}
	ps := prompts(2, 4, 97, 3)
	want := reference(ctx, t, be, fn, w, ps, s)
	g, err := generate.Open(ctx, be, nvmeConfig(t, 4<<20, true), fn, w,
		generate.Options{Logger: quiet, NoBandwidthProbe: true, PieceBytes: -1, InPlaceOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	n, b := g.InPlace()
	if n != len(g.Vars()) {
		t.Fatalf("%d of %d tensors read in place", n, len(g.Vars()))
	}
	var b32 int64
	for _, v := range g.Vars() {
		b32 += int64(v.Numel()) * 4
	}
	if b*2 != b32 {
		t.Fatalf("in place: %d bytes, want the bf16 file's %d (half the float32 model's)", b, b32/2)
	}
	res, err := g.Generate(ctx, ps, s, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.EqualFunc(res.Tokens, want, slices.Equal) {
		t.Fatalf("through zinf:\n%v\nin memory:\n%v", res.Tokens, want)
	}
	m, mres := generateMapped(ctx, t, be, fn, generate.AdviceWillNeed, path, ps, s, want)
	// The mapping's bytes are the file's (bf16), not the widened ones.
	if wb := m.WeightBytes(); wb*2 > b32 {
		t.Fatalf("mapped: %d weight bytes a pass, more than the bf16 file's %d", wb, b32/2)
	}
	if max := int64(mres.Steps) * b32 / 2; mres.BytesRead > max {
		t.Fatalf("mapped: %d bytes taken from the mapping in %d passes, more than the bf16 file's %d a pass", mres.BytesRead, mres.Steps, b32/2)
	}
}

// generateMapped generates ps from the model file at path mapped with
// advice a, closes the Generator and fails the test unless the tokens
// are want's.
func generateMapped(ctx context.Context, t *testing.T, be compute.Backend, fn generate.ModelFn, a generate.Advice, path string, ps [][]int32, s generate.Sampling, want [][]int32) (*generate.Generator, *generate.Result) {
	t.Helper()
	m, err := generate.OpenMapped(ctx, be, fn, generate.MappedOptions{Advice: a}, path)
	if err != nil {
		t.Fatal(err)
	}
	res, err := m.Generate(ctx, ps, s, nil)
	if cerr := m.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		t.Fatal(err)
	}
	if !slices.EqualFunc(res.Tokens, want, slices.Equal) {
		t.Fatalf("mapped (%s):\n%v\nin memory:\n%v", a, res.Tokens, want)
	}
	return m, res
}

// TestOpenMappedRefuses: a file that does not hold the model as it is
// (another dtype), or misses a tensor, is refused naming the tensor.
func TestOpenMappedRefuses(t *testing.T) {
	ctx := watchdog(t, 2*time.Minute)
	t.Setenv("GOMLX_FUSION", "false")
	be := backend(t)
	path := filepath.Join(t.TempDir(), "model.safetensors")
	if _, err := generate.WriteRandomModel(ctx, be, tiny(dtypes.Float32, 2), path, 1); err != nil {
		t.Fatal(err)
	}
	if _, err := generate.OpenMapped(ctx, be, tiny(dtypes.BFloat16, 2), generate.MappedOptions{}, path); err == nil || !contains(err.Error(), "token_embed/embeddings") || !contains(err.Error(), "same dtype") {
		t.Fatalf("a float32 file for a bf16 model: %v", err)
	}
	if _, err := generate.OpenMapped(ctx, be, tiny(dtypes.Float32, 3), generate.MappedOptions{}, path); err == nil || !contains(err.Error(), "layer_2") {
		t.Fatalf("a 2-layer file for a 3-layer model: %v", err)
	}
	if _, err := generate.OpenMapped(ctx, be, tiny(dtypes.Float32, 2), generate.MappedOptions{Advice: 7}, path); err == nil || !contains(err.Error(), "allowed: plain, sequential, willneed") {
		t.Fatalf("advice 7: %v", err)
	}
	if _, err := generate.WriteRandomModel(ctx, be, tiny(dtypes.Float32, 2), path, 1); err == nil || !os.IsExist(errorsUnwrapAll(err)) {
		t.Fatalf("WriteRandomModel over an existing file: %v", err)
	}
}

func errorsUnwrapAll(err error) error {
	for {
		u, ok := err.(interface{ Unwrap() error })
		if !ok || u.Unwrap() == nil {
			return err
		}
		err = u.Unwrap()
	}
}

// TestWriteRandomModelStreams: WriteRandomModel makes a 128 MiB model
// with a few MiB of heap (it never holds the model), the same bytes from
// the same seed, other bytes from another, the data section aligned and
// the tensors back to back in it (no holes, as safetensors requires).
func TestWriteRandomModelStreams(t *testing.T) {
	ctx := watchdog(t, 3*time.Minute)
	be := backend(t)
	fn := func(root *model.Scope) *transformer.Model {
		return transformer.New(root.In("transformer")).WithVocabSize(256).WithEmbedDim(512).WithNumLayers(10).WithNumHeads(8).
			WithHeadDim(64).WithFFNDim(2048).WithRoPE(10000).WithNormalization("rms").WithFinalNormalization("rms").
			WithActivation(activation.TypeSilu).WithBias(false).WithDType(dtypes.Float32)
	}
	dir := t.TempDir()
	a, b, c := filepath.Join(dir, "a"), filepath.Join(dir, "b"), filepath.Join(dir, "c")
	const bound = 16 << 20
	var peak, base uint64
	var mu sync.Mutex
	stop := make(chan struct{})
	var wg sync.WaitGroup
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	base = ms.HeapAlloc
	total0 := ms.TotalAlloc
	wg.Add(1)
	go func() { // the heap's peak, sampled
		defer wg.Done()
		tick := time.NewTicker(2 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
				var ms runtime.MemStats
				runtime.ReadMemStats(&ms)
				mu.Lock()
				peak = max(peak, ms.HeapAlloc)
				mu.Unlock()
			}
		}
	}()
	size, err := generate.WriteRandomModel(ctx, be, fn, a, 11)
	close(stop)
	wg.Wait()
	if err != nil {
		t.Fatal(err)
	}
	runtime.ReadMemStats(&ms)
	if size < 120<<20 {
		t.Fatalf("a %d-byte model: not much larger than the %d-byte bound", size, bound)
	}
	if peak > base+bound {
		t.Fatalf("heap peaked %d bytes above its %d before writing a %d-byte model (bound %d): the model was held in memory", peak-base, base, size, bound)
	}
	if alloc := ms.TotalAlloc - total0; alloc > 2*bound {
		t.Fatalf("%d bytes allocated writing a %d-byte model (bound %d)", alloc, size, 2*bound)
	}
	if fi, err := os.Stat(a); err != nil || fi.Size() != size {
		t.Fatalf("the file: %v, %v; WriteRandomModel said %d bytes", fi, err, size)
	}
	if _, err := generate.WriteRandomModel(ctx, be, fn, b, 11); err != nil {
		t.Fatal(err)
	}
	if _, err := generate.WriteRandomModel(ctx, be, fn, c, 12); err != nil {
		t.Fatal(err)
	}
	ba, _ := os.ReadFile(a)
	bb, _ := os.ReadFile(b)
	bc, _ := os.ReadFile(c)
	if !bytes.Equal(ba, bb) {
		t.Fatal("the same seed wrote different files")
	}
	if bytes.Equal(ba[4096:], bc[4096:]) {
		t.Fatal("seeds 11 and 12 wrote the same weights")
	}
	// An aligned data section with no holes; values as documented.
	w, err := generate.SafetensorsWeights(nil, a)
	if err != nil {
		t.Fatal(err)
	}
	vars, err := generate.ModelVars(be, fn)
	if err != nil {
		t.Fatal(err)
	}
	type span struct{ lo, hi int64 }
	var spans []span
	for _, v := range vars {
		_, off, _, ok := w.Locate(v)
		if !ok {
			t.Fatalf("%q is not in the file", v.Name)
		}
		spans = append(spans, span{off, off + int64(v.Numel()*v.Shape.DType.Size())})
	}
	slices.SortFunc(spans, func(x, y span) int { return int(x.lo - y.lo) })
	if spans[0].lo%4096 != 0 || spans[len(spans)-1].hi != size {
		t.Fatalf("data from %d (want a multiple of 4096) to %d (want the file's %d bytes)", spans[0].lo, spans[len(spans)-1].hi, size)
	}
	for i := 1; i < len(spans); i++ {
		if spans[i].lo != spans[i-1].hi {
			t.Fatalf("a tensor at [%d, %d) after one ending at %d: not back to back", spans[i].lo, spans[i].hi, spans[i-1].hi)
		}
	}
	for _, v := range vars {
		vals := make([]float32, v.Numel())
		if err := w.Read(ctx, v, vals); err != nil {
			t.Fatal(err)
		}
		var sum2 float64
		for _, x := range vals {
			sum2 += float64(x) * float64(x)
		}
		rms := sum2 / float64(len(vals))
		switch d := v.Shape.Dimensions; {
		case len(d) == 1:
			if vals[0] != 1 || vals[len(vals)-1] != 1 {
				t.Fatalf("%q: %v..., want ones", v.Name, vals[:3])
			}
		case contains(v.Name, "token_embed"):
			if rms < 0.9 || rms > 1.1 {
				t.Fatalf("%q: mean square %.3f, want about 1", v.Name, rms)
			}
		default:
			if want := 1 / float64(d[0]); rms < 0.9*want || rms > 1.1*want {
				t.Fatalf("%q %v: mean square %.5f, want about %.5f (1/fan-in)", v.Name, d, rms, want)
			}
		}
	}
}

package checkpoint

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/zinfio/zinf/aio"
	"github.com/zinfio/zinf/buffers"
	"github.com/zinfio/zinf/swapper"
)

// testEngine returns an engine (O_DIRECT optional) closed with the test.
func testEngine(t testing.TB, hook aio.FaultHook) aio.Engine {
	t.Helper()
	e, err := aio.New(aio.Options{Direct: aio.DirectOptional, IntraOpParallelism: 2, Faults: hook})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	return e
}

// randomTensorBytes returns n elements of dtype with random finite values
// in [-4, 4) (no NaN or Inf, so JSON and float comparisons work).
func randomTensorBytes(rng *rand.Rand, dtype swapper.DType, n int) []byte {
	out := make([]byte, n*dtype.Size())
	for i := range n {
		f := float32(rng.Float64()*8 - 4)
		switch dtype {
		case swapper.Float32:
			binary.LittleEndian.PutUint32(out[4*i:], math.Float32bits(f))
		case swapper.BFloat16:
			binary.LittleEndian.PutUint16(out[2*i:], uint16(buffers.BFloat16FromFloat32(f)))
		case swapper.Float16:
			binary.LittleEndian.PutUint16(out[2*i:], uint16(buffers.Float16FromFloat32(f)))
		}
	}
	return out
}

// toFloat32s decodes a tensor's bytes to float32 values.
func toFloat32s(dtype swapper.DType, b []byte) []float32 {
	n := len(b) / dtype.Size()
	out := make([]float32, n)
	for i := range n {
		switch dtype {
		case swapper.Float32:
			out[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
		case swapper.BFloat16:
			out[i] = buffers.BFloat16(binary.LittleEndian.Uint16(b[2*i:])).Float32()
		case swapper.Float16:
			out[i] = buffers.Float16(binary.LittleEndian.Uint16(b[2*i:])).Float32()
		}
	}
	return out
}

// spec is one tensor of a test state with its expected bytes.
type spec struct {
	file  string
	name  string
	dtype swapper.DType
	shape []int64
	data  []byte
}

// makeSpecs returns tensors of the given byte sizes (rounded to whole
// elements), cycling through the dtypes and the files.
func makeSpecs(rng *rand.Rand, files []string, sizes []int) []spec {
	dts := []swapper.DType{swapper.Float32, swapper.BFloat16, swapper.Float16}
	var out []spec
	for i, sz := range sizes {
		dt := dts[i%len(dts)]
		n := sz / dt.Size()
		shape := []int64{int64(n)}
		if n%6 == 0 && n > 0 {
			shape = []int64{2, 3, int64(n / 6)}
		}
		out = append(out, spec{
			file: files[i%len(files)], name: fmt.Sprintf("t%02d.%s.%d", i, dt, sz), dtype: dt, shape: shape,
			data: randomTensorBytes(rng, dt, n),
		})
	}
	return out
}

// stateOf groups specs into one rank's files; mk makes each Tensor.
func stateOf(step int64, specs []spec, mk func(s spec) Tensor) State {
	var files []TensorFile
	idx := map[string]int{}
	for _, s := range specs {
		i, ok := idx[s.file]
		if !ok {
			i = len(files)
			idx[s.file] = i
			files = append(files, TensorFile{Name: s.file})
		}
		files[i].Tensors = append(files[i].Tensors, mk(s))
	}
	return State{
		Step: step, Config: []byte(`{"train_batch_size": 8, "zero_optimization": {"stage": 3}}`),
		User:  map[string]string{"run": "test"},
		Ranks: []RankState{{Rank: 0, Files: files}},
	}
}

func fromMemory(s spec) Tensor { return FromBytes(s.name, s.dtype, s.shape, s.data) }

// checkReadBack opens dir (rank) and compares every spec's bytes.
func checkReadBack(t *testing.T, dir string, rank int, specs []spec) {
	t.Helper()
	r, err := OpenRank(dir, rank)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if got, want := len(r.Names()), len(specs); got != want {
		t.Fatalf("%d tensors in rank %d, want %d", got, rank, want)
	}
	shapes := map[string][]int64{}
	for _, s := range specs {
		info, err := r.Tensor(s.name)
		if err != nil {
			t.Fatal(err)
		}
		if info.DType != s.dtype || info.Bytes != int64(len(s.data)) || info.File != s.file {
			t.Fatalf("tensor %s: info %+v, want dtype %s, %d bytes, file %s", s.name, info, s.dtype, len(s.data), s.file)
		}
		dst := make([]byte, len(s.data))
		if err := r.ReadTensor(context.Background(), s.name, dst); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(dst, s.data) {
			t.Fatalf("tensor %s: bytes differ after the round trip", s.name)
		}
		shapes[s.name] = s.shape
	}
	if err := r.CheckShapes(shapes); err != nil {
		t.Fatal(err)
	}
}

// tree lists the entries of root, for failure messages.
func tree(root string) string {
	var b strings.Builder
	filepath.Walk(root, func(p string, info os.FileInfo, err error) error {
		if err == nil {
			rel, _ := filepath.Rel(root, p)
			fmt.Fprintf(&b, "  %s %d\n", rel, info.Size())
		}
		return nil
	})
	return b.String()
}

// writeStore puts data into the store under name through a pool buffer.
func writeStore(t testing.TB, store *swapper.Store, pool *buffers.Pool, name string, data []byte) {
	t.Helper()
	b, err := pool.Acquire(context.Background(), int(store.PaddedLen(int64(len(data)))), buffers.PurposeParams)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Release()
	copy(b.Bytes(), data)
	if err := store.Write(context.Background(), name, b.Bytes()[:len(data)]); err != nil {
		t.Fatal(err)
	}
}

// newStore opens a swap store in a temporary directory, with a pool to
// fill it.
func newStore(t testing.TB, eng aio.Engine) (*swapper.Store, *buffers.Pool) {
	t.Helper()
	store, err := swapper.OpenStore(swapper.StoreOptions{Paths: []string{t.TempDir()}, Engine: eng, Checksums: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	pool, err := buffers.NewPool(buffers.Options{CapacityBytes: 64 << 20, Pin: buffers.PinOff})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pool.Close() })
	return store, pool
}

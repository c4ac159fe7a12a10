package layerexec_test

import (
	"runtime"
	"runtime/debug"
	"testing"
	"unsafe"

	"github.com/gomlx/compute"
	"github.com/gomlx/compute/dtypes"
	"github.com/gomlx/compute/shapes"
	"github.com/gomlx/gomlx/core/graph"
	"github.com/gomlx/gomlx/core/tensors"

	"github.com/zinfio/zinf/contrib/gomlx/internal/layerexec"
)

// TestFinalizeRecyclesOutputs: an executor's outputs finalized with
// Finalize go back to the Go backend's pool, so calling the executor again
// allocates almost nothing in the Go heap (before, each call allocated its
// outputs again: 4 MiB here), and each call's output still holds its own
// values although its memory is the last call's.
func TestFinalizeRecyclesOutputs(t *testing.T) {
	backend, err := compute.NewWithConfig("go:ops_sequential")
	if err != nil {
		t.Fatal(err)
	}
	defer backend.Finalize()
	if !layerexec.Recycles(backend) {
		t.Fatal("Recycles is false for GoMLX's Go backend: its PutBuffer or buffer layout changed, and every executor output is allocated again (see recycle.go)")
	}
	const n = 1 << 20
	exec := graph.MustNewExec(backend, func(x, s *graph.Node) *graph.Node {
		return graph.Mul(graph.Add(x, graph.OnePlus(graph.Iota(x.Graph(), x.Shape(), 0))), s)
	})
	defer exec.Finalize()
	x := tensors.FromShape(shapes.Make(dtypes.Float32, n))
	defer x.FinalizeAll()
	check := func(out *tensors.Tensor, s float32) {
		t.Helper()
		_, b, err := layerexec.Shared(backend, out)
		if err != nil {
			t.Fatal(err)
		}
		if len(b) != 4*n {
			t.Fatalf("output of %d bytes, want %d values", len(b), n)
		}
		f := unsafe.Slice((*float32)(unsafe.Pointer(&b[0])), n)
		for _, i := range []int{0, 1, n / 2, n - 1} {
			if want := float32(i+1) * s; f[i] != want {
				t.Fatalf("scale %v: element %d is %v, want %v", s, i, f[i], want)
			}
		}
	}
	// Warm the executor and the pool.
	for s := range 3 {
		out := exec.MustExec1(x, float32(s+1))
		check(out, float32(s+1))
		layerexec.Finalize(out)
	}
	// No collection during the calls: sync.Pool drops its contents at
	// each one, which is not what is tested here.
	defer debug.SetGCPercent(debug.SetGCPercent(-1))
	const calls = 40
	// run makes the calls, freeing each output with free, and returns
	// the bytes they allocated in the Go heap.
	run := func(free func(*tensors.Tensor)) uint64 {
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		before := ms.TotalAlloc
		for s := range calls {
			out := exec.MustExec1(x, float32(s+2))
			check(out, float32(s+2))
			free(out)
		}
		runtime.ReadMemStats(&ms)
		return ms.TotalAlloc - before
	}
	// What GoMLX's own Finalize leaves: every output allocated again.
	baseline := run(func(out *tensors.Tensor) { _ = out.FinalizeAll() })
	if baseline < calls*4*n/2 {
		t.Fatalf("%d calls finalized by GoMLX allocated %d bytes: want about %d, their outputs (the test measures nothing)", calls, baseline, calls*4*n)
	}
	grew := run(func(out *tensors.Tensor) {
		layerexec.Finalize(out)
		layerexec.Finalize(out) // twice is fine
	})
	// Recycled, the outputs come back from the pool: almost nothing is
	// allocated; under the race detector, whose pool drops a quarter of
	// its puts, about a quarter to a half of the baseline.
	limit := baseline / 4
	if raceEnabled {
		limit = baseline * 3 / 4
	}
	if grew > limit {
		t.Fatalf("%d calls allocated %d bytes in the Go heap (%d when GoMLX finalizes them; at most %d wanted): their %d-byte outputs were not reused", calls, grew, baseline, limit, 4*n)
	}
	t.Logf("%d calls allocated %d bytes recycled, %d finalized by GoMLX", calls, grew, baseline)
}

// TestFinalizeLeavesCallersBuffers: a tensor over the caller's memory (a
// shared buffer, as zinf's swap-in buffers are) is finalized as before,
// never handed to the pool: a later execution's output does not land in
// it.
func TestFinalizeLeavesCallersBuffers(t *testing.T) {
	backend, err := compute.NewWithConfig("go:ops_sequential")
	if err != nil {
		t.Fatal(err)
	}
	defer backend.Finalize()
	shape := shapes.Make(dtypes.Float32, 1<<16)
	b, err := layerexec.NewBuffer(backend, shape)
	if err != nil {
		t.Fatal(err)
	}
	mem := b.Bytes
	for i := range mem {
		mem[i] = 0x5a
	}
	layerexec.Finalize(b.T)
	exec := graph.MustNewExec(backend, func(x *graph.Node) *graph.Node { return graph.Neg(x) })
	defer exec.Finalize()
	x := tensors.FromShape(shape)
	defer x.FinalizeAll()
	for range 4 {
		out := exec.MustExec1(x)
		_, ob, err := layerexec.Shared(backend, out)
		if err != nil {
			t.Fatal(err)
		}
		if &ob[0] == &mem[0] {
			t.Fatal("an execution's output was given the memory of a caller's shared buffer")
		}
		layerexec.Finalize(out)
	}
	for i, v := range mem {
		if v != 0x5a {
			t.Fatalf("byte %d of the caller's buffer changed to %#x after it was finalized", i, v)
		}
	}
}

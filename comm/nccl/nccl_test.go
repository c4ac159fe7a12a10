package nccl_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"
	"unsafe"

	"github.com/zinfio/zinf/accel"
	"github.com/zinfio/zinf/accel/cuda"
	"github.com/zinfio/zinf/comm"
	"github.com/zinfio/zinf/comm/nccl"
	"github.com/zinfio/zinf/internal/test/cudatest"
	"github.com/zinfio/zinf/internal/test/testenv"
)

// standin builds the CUDA and NCCL stand-ins and returns their options.
func standin(t *testing.T) (cuda.Options, nccl.Options) {
	t.Helper()
	cl := cudatest.Build(t)
	src, _ := filepath.Abs(filepath.Join("testdata", "nccl_standin.c"))
	nl := cudatest.CompileShared(t, src, "libnccl_standin.so")
	t.Setenv("STANDIN_FAIL", "")
	t.Setenv("STANDIN_NCCL_FAIL", "")
	t.Setenv("STANDIN_NCCL_ASYNC", "")
	return cuda.Options{Library: cl}, nccl.Options{Library: nl, StallTimeout: time.Minute}
}

// watchdogAfter bounds a world's run.
var watchdogAfter = 2 * time.Minute

// rank is one rank's device, stream and communicator.
type rank struct {
	dev *cuda.Device
	st  accel.Stream
	c   *nccl.Comm
}

// onRanks runs f on every rank of a fresh world (goroutines; each its
// own cuda.Device on the stand-in) and returns their errors.
func onRanks(t *testing.T, n int, co cuda.Options, no nccl.Options, f func(r *rank) error) []error {
	t.Helper()
	boots, err := comm.NewLocal(n, comm.LocalOptions{StallTimeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	errs := make([]error, n)
	var wg sync.WaitGroup
	for q := range n {
		wg.Go(func() {
			dev, err := cuda.Open(co)
			if err != nil {
				errs[q] = err
				boots[q].Abort(err)
				return
			}
			defer dev.Close()
			st, err := dev.NewStream()
			if err != nil {
				errs[q] = err
				boots[q].Abort(err)
				return
			}
			defer st.Close()
			c, err := nccl.New(boots[q], dev, no)
			if err != nil {
				errs[q] = err
				return
			}
			defer c.Close()
			if errs[q] = f(&rank{dev: dev, st: st, c: c}); errs[q] != nil {
				c.Abort(errs[q]) // the other ranks must not wait for this one
			}
		})
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(watchdogAfter):
		buf := make([]byte, 1<<20)
		t.Fatalf("watchdog: ranks still running after 2 minutes\n%s", buf[:runtime.Stack(buf, true)])
	}
	return errs
}

// put allocates device memory holding b.
func (r *rank) put(b []byte) (accel.Mem, error) {
	m, err := r.dev.Alloc(int64(max(len(b), 1)))
	if err != nil {
		return nil, err
	}
	if len(b) > 0 {
		if err := r.dev.CopyToDevice(r.st, m, 0, b); err != nil {
			return nil, err
		}
	}
	return m, r.st.Synchronize()
}

// get copies n bytes of m to the host.
func (r *rank) get(m accel.Mem, n int) ([]byte, error) {
	b := make([]byte, n)
	if n == 0 {
		return b, nil
	}
	if err := r.dev.CopyFromDevice(r.st, b, m, 0); err != nil {
		return nil, err
	}
	return b, r.st.Synchronize()
}

func f32bytes(v []float32) []byte {
	if len(v) == 0 {
		return nil
	}
	return unsafe.Slice((*byte)(unsafe.Pointer(&v[0])), 4*len(v))
}

func bytesF32(b []byte) []float32 {
	if len(b) == 0 {
		return nil
	}
	return unsafe.Slice((*float32)(unsafe.Pointer(&b[0])), len(b)/4)
}

// data is rank's vector for round: values over eight decades, so that a
// sum in another order differs.
func data(round, rank, n int) []float32 {
	rng := rand.New(rand.NewPCG(uint64(round), uint64(rank)))
	v := make([]float32, n)
	for i := range v {
		v[i] = (rng.Float32() - 0.5) * float32(math.Pow(10, float64(rng.IntN(8)-4)))
	}
	return v
}

// TestCollectives runs every collective on device memory at world sizes
// 1 to 4 (the ranks as goroutines, NCCL and CUDA stand-ins) and checks
// each rank's result against a rank-ordered reference, bit for bit.
func TestCollectives(t *testing.T) {
	co, no := standin(t)
	for n := 1; n <= 4; n++ {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			errs := onRanks(t, n, co, no, func(r *rank) error { return checkCollectives(r, n, false) })
			for q, err := range errs {
				if err != nil {
					t.Errorf("rank %d: %v", q, err)
				}
			}
		})
	}
}

func checkCollectives(r *rank, n int, native bool) error {
	ctx := context.Background()
	me := r.c.Rank()
	rng := rand.New(rand.NewPCG(7, uint64(n)))
	for round := range 30 {
		counts := make([]int64, n)
		equal := rng.IntN(2) == 0
		c0 := int64(rng.IntN(50))
		for q := range counts {
			counts[q] = c0
			if !equal {
				counts[q] = int64(rng.IntN(50))
			}
		}
		var off []int64
		var total int64
		for _, c := range counts {
			off = append(off, total)
			total += c
		}
		// All-gather of bytes.
		send := make([]byte, counts[me])
		for i := range send {
			send[i] = byte(me*37 + i + round)
		}
		sm, err := r.put(send)
		if err != nil {
			return err
		}
		rm, err := r.dev.Alloc(max(total, 1))
		if err != nil {
			return err
		}
		if err := r.c.AllGather(ctx, sm, rm, counts); err != nil {
			return fmt.Errorf("round %d all-gather %v: %w", round, counts, err)
		}
		got, err := r.get(rm, int(total))
		if err != nil {
			return err
		}
		for q := range n {
			for i := range counts[q] {
				if got[off[q]+i] != byte(q*37+int(i)+round) {
					return fmt.Errorf("round %d all-gather %v: byte %d of rank %d", round, counts, i, q)
				}
			}
		}
		r.dev.Free(sm)
		r.dev.Free(rm)
		// Reduce-scatter of float32, rank-ordered (the native one is
		// checked by TestNativeReductions).
		if !native {
			full := data(round, me, int(total))
			sm, err = r.put(f32bytes(full))
			if err != nil {
				return err
			}
			rm, err = r.dev.Alloc(max(4*counts[me], 1))
			if err != nil {
				return err
			}
			if err := r.c.ReduceScatter(ctx, sm, rm, counts); err != nil {
				return fmt.Errorf("round %d reduce-scatter %v: %w", round, counts, err)
			}
			b, err := r.get(rm, int(4*counts[me]))
			if err != nil {
				return err
			}
			want := make([]float32, counts[me])
			for q := range n {
				x := data(round, q, int(total))[off[me] : off[me]+counts[me]]
				for i := range want {
					if q == 0 {
						want[i] = x[i]
					} else {
						want[i] += x[i]
					}
				}
			}
			if err := same(bytesF32(b), want); err != nil {
				return fmt.Errorf("round %d reduce-scatter %v: %w", round, counts, err)
			}
			r.dev.Free(sm)
			r.dev.Free(rm)
		}
		// All-reduce, sum and max, float32.
		for _, op := range []comm.Op{comm.Sum, comm.Max} {
			v := data(round+100, me, int(c0)+1)
			m, err := r.put(f32bytes(v))
			if err != nil {
				return err
			}
			if err := r.c.AllReduce(ctx, m, int64(len(v)), op); err != nil {
				return fmt.Errorf("round %d all-reduce %v: %w", round, op, err)
			}
			b, err := r.get(m, 4*len(v))
			if err != nil {
				return err
			}
			want := data(round+100, 0, len(v))
			for q := 1; q < n; q++ {
				for i, x := range data(round+100, q, len(v)) {
					if op == comm.Sum {
						want[i] += x
					} else {
						want[i] = max(want[i], x)
					}
				}
			}
			if native && op == comm.Sum {
				want = nil // checked by TestNativeReductions
			}
			if want != nil {
				if err := same(bytesF32(b), want); err != nil {
					return fmt.Errorf("round %d all-reduce %v: %w", round, op, err)
				}
			}
			r.dev.Free(m)
		}
		// Broadcast from a rank, then a barrier.
		root := rng.IntN(n)
		bc := make([]byte, 33)
		for i := range bc {
			bc[i] = byte(me + i)
		}
		m, err := r.put(bc)
		if err != nil {
			return err
		}
		if err := r.c.Broadcast(ctx, m, int64(len(bc)), root); err != nil {
			return fmt.Errorf("round %d broadcast: %w", round, err)
		}
		b, err := r.get(m, len(bc))
		if err != nil {
			return err
		}
		for i := range b {
			if b[i] != byte(root+i) {
				return fmt.Errorf("round %d broadcast from %d: byte %d", round, root, i)
			}
		}
		r.dev.Free(m)
		if err := r.c.Barrier(ctx); err != nil {
			return err
		}
	}
	return nil
}

func same(got, want []float32) error {
	if len(got) != len(want) {
		return fmt.Errorf("%d elements, want %d", len(got), len(want))
	}
	for i := range got {
		if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
			return fmt.Errorf("[%d] = %v, want %v", i, got[i], want[i])
		}
	}
	return nil
}

// TestNativeReductions: with NativeReductions the binding calls NCCL's
// ncclReduceScatter (the stand-in adds the last rank first): its result
// equals that order's sum and differs, in the last bits, from the
// rank-ordered one that the default gives.
func TestNativeReductions(t *testing.T) {
	co, no := standin(t)
	no.NativeReductions = true
	const n = 4
	errs := onRanks(t, n, co, no, func(r *rank) error {
		ctx := context.Background()
		me := r.c.Rank()
		const per = 3000
		counts := []int64{per, per, per, per}
		full := data(1, me, n*per)
		sm, err := r.put(f32bytes(full))
		if err != nil {
			return err
		}
		rm, err := r.dev.Alloc(4 * per)
		if err != nil {
			return err
		}
		if err := r.c.ReduceScatter(ctx, sm, rm, counts); err != nil {
			return err
		}
		b, err := r.get(rm, 4*per)
		if err != nil {
			return err
		}
		ordered, reversed := make([]float32, per), make([]float32, per)
		for q := range n {
			x := data(1, q, n*per)[me*per : (me+1)*per]
			y := data(1, n-1-q, n*per)[me*per : (me+1)*per]
			for i := range ordered {
				if q == 0 {
					ordered[i], reversed[i] = x[i], y[i]
				} else {
					ordered[i] += x[i]
					reversed[i] += y[i]
				}
			}
		}
		if err := same(bytesF32(b), reversed); err != nil {
			return fmt.Errorf("native reduce-scatter is not NCCL's sum: %w", err)
		}
		if same(bytesF32(b), ordered) == nil {
			return errors.New("the native reduce-scatter equals the rank-ordered sum: the test cannot tell them apart")
		}
		big, err := r.dev.Alloc(4 * (n*per + 1))
		if err != nil {
			return err
		}
		defer r.dev.Free(big)
		bigRecv, err := r.dev.Alloc(4 * (per + 1))
		if err != nil {
			return err
		}
		defer r.dev.Free(bigRecv)
		if err := r.c.ReduceScatter(ctx, big, bigRecv, []int64{per, per, per, per + 1}); err == nil || !strings.Contains(err.Error(), "equal counts") {
			return fmt.Errorf("native reduce-scatter of unequal counts: %v", err)
		}
		return checkCollectives(r, n, true)
	})
	for q, err := range errs {
		if err != nil {
			t.Errorf("rank %d: %v", q, err)
		}
	}
}

// TestFailures: a failing NCCL call fails the communicator with an error
// naming the call and NCCL's text, and every later call returns it; an
// asynchronous error (a peer or network failure) aborts it the same way.
func TestFailures(t *testing.T) {
	co, no := standin(t)
	t.Setenv("STANDIN_NCCL_FAIL", "ncclAllGather:2")
	errs := onRanks(t, 2, co, no, func(r *rank) error {
		m, err := r.dev.Alloc(64)
		if err != nil {
			return err
		}
		err = r.c.AllGather(context.Background(), m, m, []int64{8, 8})
		var ne *nccl.Error
		if !errors.As(err, &ne) || ne.Call != "ncclAllGather" || !strings.Contains(err.Error(), "system error") {
			return fmt.Errorf("all-gather: %v, want an *nccl.Error naming ncclAllGather", err)
		}
		if err2 := r.c.Barrier(context.Background()); err2 == nil || err2.Error() != err.Error() {
			return fmt.Errorf("after the failure, a barrier: %v", err2)
		}
		return nil
	})
	for q, err := range errs {
		if err != nil {
			t.Errorf("rank %d: %v", q, err)
		}
	}
	t.Setenv("STANDIN_NCCL_FAIL", "")
	t.Setenv("STANDIN_NCCL_ASYNC", "6")
	errs = onRanks(t, 2, co, no, func(r *rank) error {
		err := r.c.Barrier(context.Background())
		var re *comm.RankError
		if !errors.As(err, &re) || !strings.Contains(err.Error(), "remote process exited") {
			return fmt.Errorf("barrier with an asynchronous error: %v", err)
		}
		return nil
	})
	for q, err := range errs {
		if err != nil {
			t.Errorf("rank %d: %v", q, err)
		}
	}
}

// TestUnavailable: without NCCL, New says what is missing (the library
// and the variable that names it); a library that is not NCCL is named
// with the symbol it lacks.
func TestUnavailable(t *testing.T) {
	co, _ := standin(t)
	dev, err := cuda.Open(co)
	if err != nil {
		t.Fatal(err)
	}
	defer dev.Close()
	boots, _ := comm.NewLocal(1, comm.LocalOptions{})
	missing := filepath.Join(t.TempDir(), "libnccl.so.2")
	_, err = nccl.New(boots[0], dev, nccl.Options{Library: missing})
	if !errors.Is(err, accel.ErrUnavailable) {
		t.Fatalf("missing library: %v", err)
	}
	if !cudatest.CgoEnabled {
		return
	}
	for _, s := range []string{missing, nccl.LibraryEnv} {
		if !strings.Contains(err.Error(), s) {
			t.Errorf("%q does not say %q", err, s)
		}
	}
	_, err = nccl.New(boots[0], dev, nccl.Options{Library: co.Library}) // the CUDA stand-in: no NCCL in it
	if !errors.Is(err, accel.ErrUnavailable) || !strings.Contains(err.Error(), "lacks ncclGetVersion") {
		t.Fatalf("a library that is not NCCL: %v", err)
	}
	if _, err := nccl.New(boots[0], nil, nccl.Options{}); err == nil {
		t.Fatal("New without a device accepted")
	}
}

// TestGPU needs an NVIDIA GPU and NCCL, and runs only with
// ZINF_GPU_TESTS=1 (or ZINF_REQUIRE_BACKENDS=nccl): one rank (a world of
// one, the most a single-GPU machine has) runs every collective through
// the real library, checked as on the stand-in.
func TestGPU(t *testing.T) {
	if os.Getenv("ZINF_GPU_TESTS") != "1" && !testenv.Required(t, "nccl") {
		t.Skip("set ZINF_GPU_TESTS=1 to run the tests that need a real NVIDIA GPU and NCCL")
	}
	if _, err := cuda.Probe(cuda.Options{}); err != nil {
		t.Fatalf("no GPU: %v", err)
	}
	errs := onRanks(t, 1, cuda.Options{}, nccl.Options{StallTimeout: time.Minute}, func(r *rank) error { return checkCollectives(r, 1, false) })
	if errs[0] != nil {
		t.Fatal(errs[0])
	}
}

// TestGPUSharedDevice needs an NVIDIA GPU and NCCL, like TestGPU: several
// ranks (goroutines, each its own context) on the one device of a
// single-GPU machine. NCCL may refuse two ranks of one communicator on the
// same device (ncclInvalidUsage, "Duplicate GPU detected"); then every rank
// must return that refusal as an error within the watchdog, none may hang.
// Where NCCL accepts it, every collective is checked against the
// rank-ordered reference bit for bit, as at world 1.
func TestGPUSharedDevice(t *testing.T) {
	if os.Getenv("ZINF_GPU_TESTS") != "1" && !testenv.Required(t, "nccl") {
		t.Skip("set ZINF_GPU_TESTS=1 to run the tests that need a real NVIDIA GPU and NCCL")
	}
	if _, err := cuda.Probe(cuda.Options{}); err != nil {
		t.Fatalf("no GPU: %v", err)
	}
	for _, n := range []int{2, 4} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			errs := onRanks(t, n, cuda.Options{}, nccl.Options{StallTimeout: time.Minute}, func(r *rank) error { return checkCollectives(r, n, false) })
			failed := 0
			for q, err := range errs {
				if err != nil {
					failed++
					t.Logf("rank %d: %v", q, err)
				}
			}
			switch {
			case failed == 0:
				t.Logf("world %d on one device: every collective equal to the reference", n)
			case failed == n:
				t.Logf("world %d on one device refused by NCCL on every rank (no hang)", n)
			default:
				t.Fatalf("world %d on one device: %d of %d ranks failed; the others returned success", n, failed, n)
			}
		})
	}
}

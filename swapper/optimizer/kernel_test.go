package optimizer_test

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"os/exec"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/zinfio/zinf/buffers"
	"github.com/zinfio/zinf/swapper/optimizer"
)

// simdKernels returns the SIMD kernels of this CPU, skipping the test
// when there are none (arm64 and other architectures run the scalar
// reference only).
func simdKernels(t *testing.T) []optimizer.Kernel {
	t.Helper()
	ks := optimizer.Kernels()
	if ks[0].Name() != optimizer.KernelScalar {
		t.Fatalf("Kernels()[0] = %s, want the scalar reference first", ks[0])
	}
	if len(ks) == 1 {
		t.Skip("no SIMD kernel on this CPU: Adam runs the scalar reference")
	}
	return ks[1:]
}

// valueClass draws float32s of one kind.
type valueClass struct {
	name string
	draw func(r *rand.Rand) float32
}

func sign(r *rand.Rand, x float32) float32 {
	if r.IntN(2) == 0 {
		return -x
	}
	return x
}

// classes are the kinds of values the differential tests mix: ordinary
// ones, zeros of both signs, subnormals, huge and tiny magnitudes (whose
// squares overflow or underflow), infinities and NaNs with random payloads
// (quiet and signalling), so every rounding and propagation path of the
// update runs.
var classes = []valueClass{
	{"normal", func(r *rand.Rand) float32 { return float32(r.NormFloat64()) }},
	{"zero", func(r *rand.Rand) float32 { return sign(r, 0) }},
	{"subnormal", func(r *rand.Rand) float32 { return sign(r, math.Float32frombits(1+r.Uint32N(1<<23-1))) }},
	{"tiny", func(r *rand.Rand) float32 { return sign(r, float32(math.Ldexp(1+r.Float64(), -120-r.IntN(6)))) }},
	{"huge", func(r *rand.Rand) float32 { return sign(r, float32(math.Ldexp(1+r.Float64(), 60+r.IntN(67)))) }},
	{"max", func(r *rand.Rand) float32 { return sign(r, math.MaxFloat32) }},
	{"inf", func(r *rand.Rand) float32 { return sign(r, float32(math.Inf(1))) }},
	{"nan", func(r *rand.Rand) float32 {
		// Exponent all ones, a non-zero random mantissa: quiet or
		// signalling, any payload, either sign.
		return math.Float32frombits(r.Uint32()&0x8000_0000 | 0x7f80_0000 | (1 + r.Uint32N(1<<23-1)))
	}},
}

// fillMixed fills s with values of random classes, mostly ordinary ones.
func fillMixed(r *rand.Rand, s []float32, special float64) {
	for i := range s {
		if r.Float64() < special {
			s[i] = classes[1+r.IntN(len(classes)-1)].draw(r)
		} else {
			s[i] = float32(r.NormFloat64() * math.Pow(10, float64(r.IntN(9)-6)))
		}
	}
}

// kernelHypers are the weight-decay modes (none, L2, AdamW, and an AdamW factor
// that rounds to 1, which the update skips) with other settings drawn.
func kernelHypers(r *rand.Rand) []optimizer.Hyper {
	lr := float32(math.Pow(10, -1-4*r.Float64()))
	return []optimizer.Hyper{
		{},
		{LR: lr, Beta1: 0.8, Beta2: 0.99, Eps: 1e-6},
		{LR: lr, WeightDecay: 0.01},
		{LR: lr, WeightDecay: 0.3, AdamW: true},
		{LR: 1e-9, WeightDecay: 1e-3, AdamW: true}, // 1 - 1e-12 rounds to 1
		{LR: lr, Beta1: 0.5, Beta2: 0.5, Eps: 1e-30, WeightDecay: 1e3},
	}
}

// equalBits reports the first element where a and b differ in any bit
// (NaN payloads and zero signs included), or -1.
func equalBits(a, b []float32) int {
	for i := range a {
		if math.Float32bits(a[i]) != math.Float32bits(b[i]) {
			return i
		}
	}
	return -1
}

// operands is one set of operands of an Adam call, each slice starting at
// its own offset into a larger array (so starts are misaligned in
// different ways) with guard values around it.
type operands struct {
	back [4][]float32 // p, g, m, v with guards
	off  [4]int
	n    int
}

const guards = 19 // elements either side of each operand, an odd count

func newOperands(r *rand.Rand, n int, special float64) *operands {
	s := &operands{n: n}
	for k := range s.back {
		s.off[k] = guards + r.IntN(17) // 0..16 elements past the guards: every misalignment
		s.back[k] = make([]float32, s.off[k]+n+guards)
		fillMixed(r, s.back[k], special)
	}
	// exp_avg_sq is non-negative in practice; keep a few negative ones
	// (a square root of a negative number is a NaN both ways too).
	v := s.slice(3)
	for i := range v {
		if r.IntN(50) != 0 {
			v[i] = float32(math.Abs(float64(v[i])))
		}
	}
	return s
}

func (s *operands) slice(k int) []float32 { return s.back[k][s.off[k] : s.off[k]+s.n] }

func (s *operands) clone() *operands {
	c := &operands{off: s.off, n: s.n}
	for k := range s.back {
		c.back[k] = slices.Clone(s.back[k])
	}
	return c
}

func (s *operands) adam(k optimizer.Kernel, step int, h optimizer.Hyper) {
	k.Adam(s.slice(0), s.slice(1), s.slice(2), s.slice(3), step, h)
}

// diff names the first operand element (guards included) where s and o
// differ bit for bit, or "".
func (s *operands) diff(o *operands) string {
	names := [4]string{"param", "grad", "exp_avg", "exp_avg_sq"}
	for k := range s.back {
		if i := equalBits(s.back[k], o.back[k]); i >= 0 {
			where := "inside"
			if i < s.off[k] || i >= s.off[k]+s.n {
				where = "a guard element outside"
			}
			return fmt.Sprintf("%s[%d] (%s the operand; offset %d): %v (%#08x) vs scalar %v (%#08x)", names[k], i-s.off[k], where, s.off[k],
				s.back[k][i], math.Float32bits(s.back[k][i]), o.back[k][i], math.Float32bits(o.back[k][i]))
		}
	}
	return ""
}

// TestKernelsMatchScalar is the differential test of the SIMD kernels
// against the scalar reference loop: every length from 0 to two vectors
// and a half (every tail, every unrolled remainder), a long odd length,
// misaligned starts, values of every class (subnormals, zeros, huge and
// tiny, Inf and NaN with random payloads) alone and mixed, every
// weight-decay mode, first and late steps, several steps in a row. Every
// bit must agree, NaN payloads and zero signs included, and nothing
// outside the slices may change.
func TestKernelsMatchScalar(t *testing.T) {
	seed := uint64(time1())
	t.Logf("seed %d", seed)
	for _, k := range simdKernels(t) {
		t.Run(k.Name(), func(t *testing.T) {
			r := rand.New(rand.NewPCG(seed, uint64(k.Lanes())))
			lens := []int{}
			for n := 0; n <= 2*k.Lanes()+1; n++ {
				lens = append(lens, n)
			}
			lens = append(lens, 5*k.Lanes()/2, 1000+7, 4096+k.Lanes()-1)
			checked := 0
			for _, h := range kernelHypers(r) {
				for _, n := range lens {
					for _, special := range []float64{0, 0.05, 0.5, 1} {
						for _, steps := range [][]int{{1}, {1, 2, 3}, {1000}, {7, 1 << 20}} {
							want := newOperands(r, n, special)
							got := want.clone()
							for _, step := range steps {
								want.adam(optimizer.Kernels()[0], step, h)
								got.adam(k, step, h)
								if d := got.diff(want); d != "" {
									t.Fatalf("%s, n=%d, specials %.0f%%, step %d of %v, %+v: %s", k, n, 100*special, step, steps, h, d)
								}
							}
							checked += n * len(steps)
						}
					}
				}
			}
			// Each class alone in every operand: all NaN gradients, all
			// Inf moments and so on.
			for _, h := range kernelHypers(r) {
				for _, c := range classes {
					for op := range 4 {
						want := newOperands(r, 3*k.Lanes()+3, 0.05)
						s := want.slice(op)
						for i := range s {
							s[i] = c.draw(r)
						}
						got := want.clone()
						want.adam(optimizer.Kernels()[0], 3, h)
						got.adam(k, 3, h)
						if d := got.diff(want); d != "" {
							t.Fatalf("%s, operand %d all %s, %+v: %s", k, op, c.name, h, d)
						}
						checked += want.n
					}
				}
			}
			t.Logf("%s: %d element updates identical to the scalar loop", k, checked)
		})
	}
}

// time1 is a seed that differs between runs (the seed is logged, so a
// failure reproduces with it).
func time1() int64 {
	if s := os.Getenv("ZINF_TEST_SEED"); s != "" {
		var v int64
		if _, err := fmt.Sscan(s, &v); err == nil {
			return v
		}
	}
	return rand.Int64()
}

// TestKernelsLong compares a long update (several million elements, the
// size of a real sub-group) element for element, and Adam (the default
// kernel) with the scalar kernel.
func TestKernelsLong(t *testing.T) {
	n := 3<<20 + 13
	if testing.Short() {
		n = 1<<16 + 13
	}
	r := rand.New(rand.NewPCG(7, 8))
	base := newOperands(r, n, 0.01)
	want := base.clone()
	want.adam(optimizer.Kernels()[0], 5, optimizer.Hyper{LR: 1e-3, WeightDecay: 0.1, AdamW: true})
	for _, k := range optimizer.Kernels() {
		got := base.clone()
		got.adam(k, 5, optimizer.Hyper{LR: 1e-3, WeightDecay: 0.1, AdamW: true})
		if d := got.diff(want); d != "" {
			t.Errorf("%s: %s", k, d)
		}
	}
	got := base.clone()
	optimizer.Adam(got.slice(0), got.slice(1), got.slice(2), got.slice(3), 5, optimizer.Hyper{LR: 1e-3, WeightDecay: 0.1, AdamW: true})
	if d := got.diff(want); d != "" {
		t.Errorf("Adam (default kernel %s): %s", optimizer.DefaultKernel(), d)
	}
}

func TestKernelByName(t *testing.T) {
	ks := optimizer.Kernels()
	for _, k := range ks {
		got, err := optimizer.KernelByName(k.Name())
		if err != nil || got.Name() != k.Name() {
			t.Errorf("KernelByName(%q) = %v, %v", k.Name(), got, err)
		}
	}
	for _, name := range []string{"", optimizer.KernelAuto} {
		got, err := optimizer.KernelByName(name)
		if err != nil || got.Name() != ks[min(1, len(ks)-1)].Name() {
			t.Errorf("KernelByName(%q) = %v, %v; want the fastest, %s", name, got, err, ks[min(1, len(ks)-1)])
		}
	}
	bad := []string{"sse", "AVX2", "Neon", "scalar "}
	// Every other architecture's kernels (and AVX-512 on an AVX2 CPU) are
	// named but not available here.
	for _, name := range []string{optimizer.KernelAVX2, optimizer.KernelAVX512, optimizer.KernelNEON} {
		if !slices.ContainsFunc(ks, func(k optimizer.Kernel) bool { return k.Name() == name }) {
			bad = append(bad, name)
		}
	}
	for _, name := range bad {
		_, err := optimizer.KernelByName(name)
		if err == nil || !strings.Contains(err.Error(), fmt.Sprintf("%q", name)) || !strings.Contains(err.Error(), "allowed: auto, scalar") {
			t.Errorf("KernelByName(%q): error %v, want one naming the value and the kernels allowed", name, err)
		}
	}
	var zero optimizer.Kernel
	if zero.Name() != optimizer.KernelScalar || zero.Lanes() != 1 {
		t.Errorf("zero Kernel is %s with %d lanes, want scalar with 1", zero, zero.Lanes())
	}
}

// TestKernelEnv runs this test binary again with ZINF_OPTIMIZER_KERNEL set
// (the default kernel is chosen once per process): scalar and each
// kernel's name select it, a bad value leaves Adam on the scalar loop and
// makes New fail naming the variable.
func TestKernelEnv(t *testing.T) {
	if os.Getenv("ZINF_KERNEL_ENV_CHILD") != "" {
		kernelEnvChild(t)
		return
	}
	cases := []string{"scalar", "auto", "", "bogus"}
	for _, k := range optimizer.Kernels()[1:] {
		cases = append(cases, k.Name())
	}
	for _, v := range cases {
		cmd := selfCommand("-test.run=^TestKernelEnv$", "-test.count=1")
		cmd.Env = append(os.Environ(), "ZINF_KERNEL_ENV_CHILD=1", optimizer.KernelEnv+"="+v)
		out, err := cmd.CombinedOutput()
		if errors.Is(err, syscall.ENOEXEC) {
			t.Skipf("cannot run this test binary again (%v): an emulated architecture without binfmt_misc; set %s to the emulator (make test-arm64 does)", err, testExecEnv)
		}
		if err != nil {
			t.Errorf("%s=%q: %v\n%s", optimizer.KernelEnv, v, err, out)
		}
	}
}

// testExecEnv names the program that runs this test binary again for the
// tests that start it as a child, when the kernel cannot run it itself:
// the emulator of a test binary built for another architecture, such as
// qemu-aarch64 (make test-arm64 sets it).
const testExecEnv = "ZINF_TEST_EXEC"

// selfCommand returns a command that runs this test binary with args,
// through $ZINF_TEST_EXEC when that is set.
func selfCommand(args ...string) *exec.Cmd {
	if wrap := strings.Fields(os.Getenv(testExecEnv)); len(wrap) > 0 {
		return exec.Command(wrap[0], append(append(wrap[1:], os.Args[0]), args...)...)
	}
	return exec.Command(os.Args[0], args...)
}

func kernelEnvChild(t *testing.T) {
	v := os.Getenv(optimizer.KernelEnv)
	want := v
	if v == "" || v == optimizer.KernelAuto {
		want = optimizer.Kernels()[min(1, len(optimizer.Kernels())-1)].Name()
	}
	pool, err := buffers.NewPool(buffers.Options{CapacityBytes: 1 << 20, Pin: buffers.PinOff})
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	opt, newErr := optimizer.New(optimizer.Options{Pool: pool, Grads: constGrads(1)})
	if newErr == nil {
		defer opt.Close()
		if got := opt.Kernel().Name(); got != want {
			t.Errorf("%s=%q: the optimizer runs %s, want %s", optimizer.KernelEnv, v, got, want)
		}
	}
	if v == "bogus" {
		want = optimizer.KernelScalar
		if newErr == nil || !strings.Contains(newErr.Error(), optimizer.KernelEnv) || !strings.Contains(newErr.Error(), `"bogus"`) {
			t.Errorf("New with %s=bogus: %v, want an error naming the variable and value", optimizer.KernelEnv, newErr)
		}
	} else if newErr != nil {
		t.Errorf("New with %s=%q: %v", optimizer.KernelEnv, v, newErr)
	}
	if got := optimizer.DefaultKernel().Name(); got != want {
		t.Errorf("%s=%q: DefaultKernel %s, want %s", optimizer.KernelEnv, v, got, want)
	}
}

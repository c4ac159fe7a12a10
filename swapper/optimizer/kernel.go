package optimizer

//go:generate sh -c "cd internal/asmgen && go run . -out ../../kernel_amd64.s -stubs ../../kernel_amd64_stubs.go -pkg optimizer"
//go:generate sh -c "cd internal/asmgen && go run . -neon ../../kernel_arm64.s -neonstubs ../../kernel_arm64_stubs.go"

import (
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/zinfio/zinf/internal/base/yield"
)

// KernelEnv is the environment variable that picks the kernel of Adam, of
// Update and of optimizers whose Options.Kernel is empty: "auto" (or unset: the
// widest SIMD kernel this CPU runs), "scalar" (the portable reference
// loop), or the name of a SIMD kernel ("avx2", "avx512" on amd64, "neon"
// on arm64). New fails on a value that is not one of those or not
// available on this CPU.
const KernelEnv = "ZINF_OPTIMIZER_KERNEL"

// Kernel names.
const (
	KernelAuto   = "auto"
	KernelScalar = "scalar"
	KernelAVX2   = "avx2"
	KernelAVX512 = "avx512"
	KernelNEON   = "neon"
)

// Kernel is one implementation of zinf's update rules (Adam, SGD, Adagrad,
// Lion): the scalar reference loops or SIMD versions of them for an
// instruction set. Every kernel gives exactly the scalar loops' bits (same
// operations in the same order, each rounded on its own: no fused
// multiply-add, no approximate reciprocal or square root), so the choice
// changes speed, never results. The zero Kernel is the scalar one.
type Kernel struct{ k *kernel }

// kernel is the internal interface an instruction set implements: for
// each update rule, a vector body that processes a whole number of vectors
// (n a multiple of lanes, n >= lanes, all slices that long) with exactly
// the operations of the rule's scalar reference loop, which runs the tail.
// A nil body means the rule has no vector version on this instruction set
// and runs scalar.
//
// Adding a rule: write its scalar reference (one element at a time,
// explicit float32 conversions so nothing fuses), its per-step constants
// in a fixed-size array the assembly reads and its optional operations as
// mode bits, a body field here, its generator next to genAdam in
// internal/asmgen, and a run method like runAdam that runs the body on the
// whole vectors and the reference on the tail; TestKernelsMatchScalar and
// TestRuleKernelsMatchScalar show how to prove it bit-identical.
type kernel struct {
	name  string
	lanes int // float32 lanes of one vector operation
	// adam updates elements [0, n) in place; args are its constants
	// (adamArgs.k: by value, so that calling through the function value
	// moves nothing to the heap), mode its weight-decay mode (decayNone,
	// decayL2, decayAdamW).
	adam func(p, grad, m, v *float32, n int, args [adamArgCount]float32, mode int)
	// sgd, adagrad and lion do the same for the other rules, with their
	// constants (sgdArgs, adagradArgs, lionArgs) and mode bits.
	// sgd's buf is nil without momentum (mode without sgdMomentum).
	sgd     func(w, grad, buf *float32, n int, args [sgdArgCount]float32, mode int)
	adagrad func(w, grad, s *float32, n int, args [adagradArgCount]float32, mode int)
	lion    func(w, grad, m *float32, n int, args [lionArgCount]float32, mode int)
	// adam8 runs Adam8 on blocks whole blocks of Blockwise8BlockSize
	// elements (adam8Scalar's operations): p, grad, the codes qm, qv and
	// one absmax per block in am, av, updated in place; tm and tv are the
	// maps' tables, scratch adam8ScratchLen float32s. Nil: scalar.
	adam8 func(p, grad *float32, qm, qv *uint8, am, av *float32, blocks int, args [adamArgCount]float32, mode int, tm, tv *byte, scratch *float32)
}

var scalarKernel = &kernel{name: KernelScalar, lanes: 1}

// simdKernels are this CPU's SIMD kernels, widest first; platform files
// add theirs at init.
var simdKernels []*kernel

// Kernels returns the kernels this CPU runs: the scalar reference first,
// then the SIMD ones, widest (the default) first.
func Kernels() []Kernel {
	out := []Kernel{{scalarKernel}}
	for _, k := range simdKernels {
		out = append(out, Kernel{k})
	}
	return out
}

// KernelByName returns the kernel named name: "auto" or "" for the
// widest SIMD kernel this CPU runs (else scalar), "scalar", or a SIMD
// kernel's name. A name that is unknown or not available on this CPU is an
// error listing those that are.
func KernelByName(name string) (Kernel, error) {
	switch name {
	case "", KernelAuto:
		if len(simdKernels) > 0 {
			return Kernel{simdKernels[0]}, nil
		}
		return Kernel{scalarKernel}, nil
	case KernelScalar:
		return Kernel{scalarKernel}, nil
	}
	for _, k := range simdKernels {
		if k.name == name {
			return Kernel{k}, nil
		}
	}
	names := []string{KernelAuto}
	for _, k := range Kernels() {
		names = append(names, k.Name())
	}
	return Kernel{}, fmt.Errorf("optimizer: kernel %q is not available on this CPU (allowed: %s)", name, strings.Join(names, ", "))
}

var defaultKernel = sync.OnceValues(func() (Kernel, error) {
	name := os.Getenv(KernelEnv)
	k, err := KernelByName(strings.TrimSpace(name))
	if err != nil {
		return Kernel{scalarKernel}, fmt.Errorf("%s=%q: %w", KernelEnv, name, err)
	}
	return k, nil
})

// DefaultKernel is the kernel Adam runs and optimizers use by default: the
// one ZINF_OPTIMIZER_KERNEL names (KernelEnv), else the widest this CPU
// runs. With an invalid ZINF_OPTIMIZER_KERNEL it is the scalar kernel (and
// New reports the variable).
func DefaultKernel() Kernel {
	k, _ := defaultKernel()
	return k
}

// resolveKernel is the kernel an optimizer with Options.Kernel name uses.
func resolveKernel(name string) (Kernel, error) {
	if name == "" {
		return defaultKernel()
	}
	return KernelByName(name)
}

// Name returns the kernel's name ("scalar", "avx2", "avx512", "neon").
func (k Kernel) Name() string { return k.impl().name }

// Lanes returns the float32 elements one vector operation of the kernel
// handles (1 for the scalar kernel). A call's last len%Lanes elements run
// through the scalar loop.
func (k Kernel) Lanes() int { return k.impl().lanes }

// String returns the kernel's name.
func (k Kernel) String() string { return k.Name() }

func (k Kernel) impl() *kernel {
	if k.k == nil {
		return scalarKernel
	}
	return k.k
}

// Adam is the package function Adam run on this kernel: same contract,
// same bits.
func (k Kernel) Adam(p, g, m, v []float32, step int, h Hyper) {
	checkLens(p, g, m, v)
	a := newAdamArgs(step, h)
	k.impl().runAdam(p, g, m, v, &a)
}

// Update is the package function Update run on this kernel: same
// contract, same bits.
func (k Kernel) Update(w, g []float32, st [][]float32, step int, h Hyper, p StepParams) {
	n := len(w)
	if len(g) < n || len(st) != h.StateCount() {
		panic(fmt.Sprintf("optimizer.Update: %d parameters, %d gradients, %d state arrays (%s keeps %d)", n, len(g), len(st), h.Rule, h.StateCount()))
	}
	for j, s := range st {
		if len(s) < n {
			panic(fmt.Sprintf("optimizer.Update: %d parameters but state %d (%s) has %d elements", n, j, h.StateNames()[j], len(s)))
		}
	}
	if p.ScaleGrads {
		ScaleGrad(g[:n], p.GradScale)
	}
	a := newRuleArgs(step, h.With(p))
	k.impl().run(w, g[:n], st, &a)
}

// runAdam updates p, g, m, v (equal lengths checked by the caller): the
// whole vectors on the SIMD body, the rest on the reference loop.
func (k *kernel) runAdam(p, g, m, v []float32, a *adamArgs) {
	n := len(p)
	done := 0
	if k.adam != nil && n >= k.lanes {
		done = n - n%k.lanes
		k.adam(&p[0], &g[0], &m[0], &v[0], done, a.k, a.mode)
	}
	if done < n {
		adamScalar(p[done:n], g[done:n], m[done:n], v[done:n], a)
	}
}

// runSGD is runAdam for SGD; buf is unused (and may be nil) without
// momentum.
func (k *kernel) runSGD(w, g, buf []float32, a *sgdArgs) {
	n := len(w)
	g = g[:n]
	momentum := a.mode&sgdMomentum != 0
	if momentum {
		buf = buf[:n]
	}
	done := 0
	if k.sgd != nil && n >= k.lanes {
		done = n - n%k.lanes
		var b *float32
		if momentum {
			b = &buf[0]
		}
		k.sgd(&w[0], &g[0], b, done, a.k, a.mode)
	}
	if done < n {
		if momentum {
			buf = buf[done:n]
		}
		sgdScalar(w[done:n], g[done:n], buf, a)
	}
}

// runAdagrad is runAdam for Adagrad.
func (k *kernel) runAdagrad(w, g, s []float32, a *adagradArgs) {
	n := len(w)
	g, s = g[:n], s[:n]
	done := 0
	if k.adagrad != nil && n >= k.lanes {
		done = n - n%k.lanes
		k.adagrad(&w[0], &g[0], &s[0], done, a.k, a.mode)
	}
	if done < n {
		adagradScalar(w[done:n], g[done:n], s[done:n], a)
	}
}

// runLion is runAdam for Lion.
func (k *kernel) runLion(w, g, m []float32, a *lionArgs) {
	n := len(w)
	g, m = g[:n], m[:n]
	done := 0
	if k.lion != nil && n >= k.lanes {
		done = n - n%k.lanes
		k.lion(&w[0], &g[0], &m[0], done, a.k, a.mode)
	}
	if done < n {
		lionScalar(w[done:n], g[done:n], m[done:n], a)
	}
}

// ruleArgs are the constants of one step of any rule: the rule and its
// arguments, computed once per step (or per sub-group) and shared by
// every chunk of a split update.
type ruleArgs struct {
	rule    Rule
	adam    adamArgs
	sgd     sgdArgs
	adagrad adagradArgs
	lion    lionArgs
}

// newRuleArgs computes the constants of step number step (1-based) of h's
// rule with h taken as it is (no defaults filled).
func newRuleArgs(step int, h Hyper) ruleArgs {
	a := ruleArgs{rule: h.Rule}
	switch h.Rule {
	case RuleSGD:
		a.sgd = newSGDArgs(step, h)
	case RuleAdagrad:
		a.adagrad = newAdagradArgs(step, h)
	case RuleLion:
		a.lion = newLionArgs(h)
	default:
		a.adam = newAdamArgsExact(step, h)
	}
	return a
}

// run updates w and the states st with gradients g on k: elements
// [0, len(w)) of each, whose lengths the caller checked.
func (k *kernel) run(w, g []float32, st [][]float32, a *ruleArgs) {
	switch a.rule {
	case RuleSGD:
		var buf []float32
		if len(st) > 0 {
			buf = st[0]
		}
		k.runSGD(w, g, buf, &a.sgd)
	case RuleAdagrad:
		k.runAdagrad(w, g, st[0], &a.adagrad)
	case RuleLion:
		k.runLion(w, g, st[0], &a.lion)
	default:
		n := len(w)
		k.runAdam(w, g[:n], st[0][:n], st[1][:n], &a.adam)
	}
}

// minChunk is the fewest elements a chunk of a split update has: about
// 30-100 µs of work, so that handing chunks out and starting goroutines (a
// few µs) stays small beside it.
const minChunk = 1 << 16

// chunksPerWorker is how many chunks a split update is cut into per
// worker: workers take chunks as they come free, so a worker whose core
// is busy with another process delays the update by one small chunk, not
// by its whole share.
const chunksPerWorker = 4

// splitWorkers is how many goroutines split runs an update of n elements
// on: at most workers, and no more than there are chunks of minChunk.
func splitWorkers(n, workers int) int { return min(workers, n/minChunk) }

// split calls f on chunks [lo, hi) covering [0, n) on splitWorkers(n,
// workers) goroutines (this one included), which take chunks of at least
// minChunk elements (whole cache lines, so no two write one line) until
// none is left, and returns when every call has. Callers run an update
// that needs one goroutine themselves, without the closure split takes.
func split(n, workers int, f func(lo, hi int)) { splitAligned(n, workers, 16, f) }

// splitAligned is split with chunks of a multiple of align elements (a
// power of two dividing minChunk), so that no chunk boundary falls inside
// a block of align elements.
//
// While compute is marked (package yield), each goroutine calls
// yield.Point before each chunk after its first, and one goroutine's
// update goes in chunks of minChunk too.
func splitAligned(n, workers, align int, f func(lo, hi int)) {
	w := splitWorkers(n, workers)
	if w <= 1 {
		if n <= 2*minChunk || !yield.Active() {
			f(0, n)
			return
		}
		for lo := 0; lo < n; lo += minChunk {
			if lo > 0 {
				yield.Point()
			}
			f(lo, min(lo+minChunk, n))
		}
		return
	}
	chunk := max(minChunk, (n/(w*chunksPerWorker)+align-1)&^(align-1))
	chunks := (n + chunk - 1) / chunk
	var next atomic.Int64
	run := func() {
		for first := true; ; first = false {
			c := int(next.Add(1) - 1)
			if c >= chunks {
				return
			}
			if !first {
				yield.Point()
			}
			f(c*chunk, min((c+1)*chunk, n))
		}
	}
	var wg sync.WaitGroup
	for range w - 1 {
		wg.Go(run)
	}
	run()
	wg.Wait()
}

// adamSplit updates p, g, m, v on up to workers goroutines (split).
// Elements are independent, so the bits are those of one call over the
// whole range.
func (k *kernel) adamSplit(p, g, m, v []float32, a *adamArgs, workers int) {
	n := len(p)
	g, m, v = g[:n], m[:n], v[:n]
	if splitWorkers(n, workers) <= 1 && !yield.Active() {
		k.runAdam(p, g, m, v, a)
		return
	}
	split(n, workers, func(lo, hi int) {
		k.runAdam(p[lo:hi], g[lo:hi], m[lo:hi], v[lo:hi], a)
	})
}

// updateSplit is one step (number step) of h's rule, taken as it is, on
// w, g and the states st (each at least len(w) long) on up to workers
// goroutines (split): the bits are those of one call over the whole range.
func (k *kernel) updateSplit(w, g []float32, st [][]float32, step int, h Hyper, workers int) {
	n := len(w)
	g = g[:n]
	if splitWorkers(n, workers) <= 1 && !yield.Active() {
		a := newRuleArgs(step, h)
		k.run(w, g, st, &a)
		return
	}
	a := newRuleArgs(step, h)
	split(n, workers, func(lo, hi int) {
		var part [MaxArrays][]float32
		ps := part[:len(st)]
		for j := range ps {
			ps[j] = st[j][lo:hi]
		}
		k.run(w[lo:hi], g[lo:hi], ps, &a)
	})
}

package optimizer

//go:generate sh -c "cd internal/asmgen && go run . -out ../../kernel_amd64.s -stubs ../../kernel_amd64_stubs.go -pkg optimizer"

import (
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
)

// KernelEnv is the environment variable that picks the kernel of Adam and
// of optimizers whose Options.Kernel is empty: "auto" (or unset: the
// widest SIMD kernel this CPU runs), "scalar" (the portable reference
// loop), or the name of a SIMD kernel ("avx2", "avx512" on amd64). New
// fails on a value that is not one of those or not available on this CPU.
const KernelEnv = "ZINF_OPTIMIZER_KERNEL"

// Kernel names.
const (
	KernelAuto   = "auto"
	KernelScalar = "scalar"
	KernelAVX2   = "avx2"
	KernelAVX512 = "avx512"
)

// Kernel is one implementation of zinf's update rule: the scalar reference
// loop or a SIMD version of it for an instruction set. Every kernel gives
// exactly the scalar loop's bits (same operations in the same order, each
// rounded on its own: no fused multiply-add, no approximate reciprocal or
// square root), so the choice changes speed, never results. The zero
// Kernel is the scalar one.
type Kernel struct{ k *kernel }

// kernel is the internal interface an instruction set implements: for
// each update rule, a vector body that processes a whole number of vectors
// (n a multiple of lanes, n >= lanes, all slices that long) with exactly
// the operations of the rule's scalar reference loop, which runs the tail.
// A nil body means the rule has no vector version on this instruction set
// and runs scalar.
//
// Adding a rule (SGD with momentum, Adagrad, Lion): write its scalar
// reference (one element at a time, explicit float32 conversions so
// nothing fuses), its per-step constants in a fixed-size array the
// assembly reads, a body field here, its generator next to genAdam in
// internal/asmgen, and a wrapper like Kernel.Adam that runs the body on
// the whole vectors and the reference on the tail; the differential tests
// in kernel_test.go show how to prove it bit-identical.
type kernel struct {
	name  string
	lanes int // float32 lanes of one vector operation
	// adam updates elements [0, n) in place; args.k are its constants,
	// args.mode its weight-decay mode (decayNone, decayL2, decayAdamW).
	adam func(p, grad, m, v *float32, n int, args *[adamArgCount]float32, mode int)
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

// Name returns the kernel's name ("scalar", "avx2", "avx512").
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

// runAdam updates p, g, m, v (equal lengths checked by the caller): the
// whole vectors on the SIMD body, the rest on the reference loop.
func (k *kernel) runAdam(p, g, m, v []float32, a *adamArgs) {
	n := len(p)
	done := 0
	if k.adam != nil && n >= k.lanes {
		done = n - n%k.lanes
		k.adam(&p[0], &g[0], &m[0], &v[0], done, &a.k, a.mode)
	}
	if done < n {
		adamScalar(p[done:n], g[done:n], m[done:n], v[done:n], a)
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

// adamSplit updates p, g, m, v on up to workers goroutines (this one
// included), which take chunks of at least minChunk elements (whole cache
// lines, so no two write one line) until none is left. Elements are
// independent, so the bits are those of one call over the whole range.
func (k *kernel) adamSplit(p, g, m, v []float32, a *adamArgs, workers int) {
	n := len(p)
	g, m, v = g[:n], m[:n], v[:n]
	w := min(workers, n/minChunk)
	if w <= 1 {
		k.runAdam(p, g, m, v, a)
		return
	}
	chunk := max(minChunk, (n/(w*chunksPerWorker)+15)&^15)
	chunks := (n + chunk - 1) / chunk
	var next atomic.Int64
	run := func() {
		for {
			c := int(next.Add(1) - 1)
			if c >= chunks {
				return
			}
			lo, hi := c*chunk, min((c+1)*chunk, n)
			k.runAdam(p[lo:hi], g[lo:hi], m[lo:hi], v[lo:hi], a)
		}
	}
	var wg sync.WaitGroup
	for range w - 1 {
		wg.Go(run)
	}
	run()
	wg.Wait()
}

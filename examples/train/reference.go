package train

import (
	"context"

	"github.com/zinfio/zinf/swapper/optimizer"
)

// memBackend keeps everything in Go memory: the reference the offloaded run
// must equal bit for bit.
type memBackend struct {
	spec    Spec
	hyper   optimizer.Hyper
	master  map[string][]float32 // fp32 master weights
	compute map[string][]float32 // master rounded to the param dtype
	m, v    map[string][]float32
	grad    map[string][]float32
	fresh   map[string]bool // no gradient accumulated since the last step
	steps   int
}

func newMemBackend(spec Spec, h optimizer.Hyper) *memBackend {
	b := &memBackend{spec: spec, hyper: h, master: map[string][]float32{}, compute: map[string][]float32{},
		m: map[string][]float32{}, v: map[string][]float32{}, grad: map[string][]float32{}, fresh: map[string]bool{}}
	for _, n := range spec.ParamNames() {
		b.master[n] = spec.InitMaster(n)
		c := append([]float32(nil), b.master[n]...)
		spec.Quantize(c)
		b.compute[n] = c
		b.m[n] = make([]float32, len(c))
		b.v[n] = make([]float32, len(c))
		b.grad[n] = make([]float32, len(c))
		b.fresh[n] = true
	}
	return b
}

func (b *memBackend) beginLayer(context.Context, int) error { return nil }
func (b *memBackend) endLayer(int)                          {}
func (b *memBackend) startPass([]int)                       {}
func (b *memBackend) handOver(context.Context, int)         {}

func (b *memBackend) gather(_ context.Context, name string, dst []float32) error {
	copy(dst, b.compute[name])
	return nil
}

func (b *memBackend) accumulate(_ context.Context, name string, g []float32) error {
	acc := b.grad[name]
	if b.fresh[name] {
		copy(acc, g)
		b.fresh[name] = false
		return nil
	}
	for i, x := range g {
		acc[i] += x
	}
	return nil
}

func (b *memBackend) step(context.Context) error {
	b.steps++
	for _, n := range b.spec.ParamNames() {
		optimizer.Adam(b.master[n], b.grad[n], b.m[n], b.v[n], b.steps, b.hyper)
		c := b.compute[n]
		copy(c, b.master[n])
		b.spec.Quantize(c)
		b.fresh[n] = true
	}
	return nil
}

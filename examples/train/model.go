package train

import (
	"fmt"
	"math"
	"math/rand/v2"

	"github.com/zinfio/zinf/buffers"
	"github.com/zinfio/zinf/swapper"
)

// Spec is the simulated model: Layers dense layers of Width x Width with a
// bias each, ReLU between them, mean-squared-error loss against a synthetic
// target; Batch rows per micro-batch per rank.
type Spec struct {
	Layers, Width, Batch int
	// DType is the parameter dtype used for compute; the optimizer keeps an
	// fp32 master copy when it is not fp32.
	DType swapper.DType
	Seed  uint64
}

// Validate reports impossible specs.
func (s Spec) Validate() error {
	if s.Layers < 1 || s.Width < 1 || s.Batch < 1 {
		return fmt.Errorf("train: layers %d, width %d and batch %d must all be at least 1", s.Layers, s.Width, s.Batch)
	}
	return nil
}

// WeightName and BiasName name layer l's parameters (the names policy's
// model inventory uses too).
func WeightName(l int) string { return fmt.Sprintf("layer%03d.weight", l) }

// BiasName names layer l's bias.
func BiasName(l int) string { return fmt.Sprintf("layer%03d.bias", l) }

// ParamNames lists every parameter in order of use.
func (s Spec) ParamNames() []string {
	out := make([]string, 0, 2*s.Layers)
	for l := 0; l < s.Layers; l++ {
		out = append(out, WeightName(l), BiasName(l))
	}
	return out
}

// Numel returns a parameter's element count.
func (s Spec) Numel(name string) int {
	if len(name) > 5 && name[len(name)-5:] == ".bias" {
		return s.Width
	}
	return s.Width * s.Width
}

// ParamCount is the number of parameters.
func (s Spec) ParamCount() int64 { return int64(s.Layers) * int64(s.Width*s.Width+s.Width) }

// InitMaster returns the initial fp32 master values of a parameter,
// deterministic in (Seed, name).
func (s Spec) InitMaster(name string) []float32 {
	n := s.Numel(name)
	out := make([]float32, n)
	h := uint64(0)
	for _, c := range name {
		h = h*131 + uint64(c)
	}
	rng := rand.New(rand.NewPCG(s.Seed, h))
	scale := float32(1 / math.Sqrt(float64(s.Width)))
	for i := range out {
		out[i] = (rng.Float32()*2 - 1) * scale
	}
	return out
}

// Batch returns rank's micro-batch for (step, micro): inputs and targets,
// Batch x Width each, deterministic.
func (s Spec) Data(step, micro, rank int) (x, y []float32) {
	rng := rand.New(rand.NewPCG(s.Seed^0xda7a, uint64(step)<<32|uint64(micro)<<16|uint64(rank)))
	x = make([]float32, s.Batch*s.Width)
	y = make([]float32, s.Batch*s.Width)
	for i := range x {
		x[i] = rng.Float32()*2 - 1
		y[i] = rng.Float32()*2 - 1
	}
	return x, y
}

// Quantize rounds fp32 values to the spec's dtype and back (in place): the
// values compute sees when params are bf16 or fp16.
func (s Spec) Quantize(v []float32) {
	switch s.DType {
	case swapper.BFloat16:
		for i, f := range v {
			v[i] = buffers.BFloat16FromFloat32(f).Float32()
		}
	case swapper.Float16:
		for i, f := range v {
			v[i] = buffers.Float16FromFloat32(f).Float32()
		}
	}
}

// Forward computes out = in · Wᵀ + b for one layer (in: Batch x Width,
// w: Width x Width row-major out x in), then ReLU unless last. z keeps the
// pre-activation for backward.
func Forward(in, w, b, z, out []float32, batch, width int, last bool) {
	for r := 0; r < batch; r++ {
		x := in[r*width : (r+1)*width]
		for o := 0; o < width; o++ {
			row := w[o*width : (o+1)*width]
			acc := b[o]
			for i, xv := range x {
				acc += row[i] * xv
			}
			z[r*width+o] = acc
			if !last && acc < 0 {
				acc = 0
			}
			out[r*width+o] = acc
		}
	}
}

// LossGrad returns the mean squared error of out against y and writes its
// gradient with respect to out into d.
func LossGrad(out, y, d []float32) float32 {
	var loss float32
	scale := 2 / float32(len(out))
	for i := range out {
		e := out[i] - y[i]
		loss += e * e
		d[i] = e * scale
	}
	return loss / float32(len(out))
}

// Backward takes dOut (gradient at the layer's output), the layer's input
// and pre-activation z, and accumulates dW (+=) and db (+=), and writes dIn
// (when not nil). ReLU's derivative applies unless last.
func Backward(dOut, in, z, w, dW, db, dIn []float32, batch, width int, last bool) {
	dz := make([]float32, width)
	for r := 0; r < batch; r++ {
		for o := 0; o < width; o++ {
			g := dOut[r*width+o]
			if !last && z[r*width+o] <= 0 {
				g = 0
			}
			dz[o] = g
		}
		x := in[r*width : (r+1)*width]
		for o, g := range dz {
			if g == 0 {
				continue
			}
			row := dW[o*width : (o+1)*width]
			for i, xv := range x {
				row[i] += g * xv
			}
			db[o] += g
		}
		if dIn != nil {
			d := dIn[r*width : (r+1)*width]
			clear(d)
			for o, g := range dz {
				if g == 0 {
					continue
				}
				wr := w[o*width : (o+1)*width]
				for i := range d {
					d[i] += g * wr[i]
				}
			}
		}
	}
}

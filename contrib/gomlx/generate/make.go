package generate

import (
	"bufio"
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"hash/fnv"
	"math"
	"os"
	"strings"

	"github.com/gomlx/compute"
	"github.com/gomlx/compute/dtypes"
)

// modelAlign is the alignment WriteRandomModel gives the data section: a
// tensor that starts on a device block is read in place with no move in
// memory after the O_DIRECT read.
const modelAlign = 4096

// makeChunk is the values WriteRandomModel makes and writes at a time: its
// memory, whatever the model's size.
const makeChunk = 1 << 18

// WriteRandomModel writes the model fn builds to a new safetensors file at
// path (it refuses to overwrite one), every variable under its own path
// (Var.Name) in the model's dtype, with random values drawn from seed:
// deterministic, made and written a chunk at a time (a few MiB of memory
// for a model of any size; the model is never whole in memory). The values
// keep activations finite: a matrix uniform with standard deviation
// 1/sqrt(its first dimension, the fan-in), the token embedding's 1, a
// normalization's scale 1 and every other vector 0. The data section
// begins on a 4096-byte boundary (the header padded with spaces, as the
// format allows) and the tensors lie back to back in it, with no holes (as
// the format requires), so a tensor begins on a 4096-byte boundary when
// those before it are multiples of 4096 bytes (bf16 dimensions that are
// multiples of 2048). Open reads every tensor in place by O_DIRECT
// (InPlaceWeights), wherever it begins, and OpenMapped maps the file. It
// returns the file's size.
func WriteRandomModel(ctx context.Context, backend compute.Backend, fn ModelFn, path string, seed int64) (size int64, err error) {
	vars, err := ModelVars(backend, fn)
	if err != nil {
		return 0, err
	}
	type entry struct {
		DType   string  `json:"dtype"`
		Shape   []int   `json:"shape"`
		Offsets []int64 `json:"data_offsets"`
	}
	header := map[string]any{"__metadata__": map[string]string{"format": "pt", "zinf": fmt.Sprintf("random weights, seed %d", seed)}}
	offs := make([]int64, len(vars))
	var end int64
	for i, v := range vars {
		var name string
		switch v.Shape.DType {
		case dtypes.BFloat16:
			name = "BF16"
		case dtypes.Float32:
			name = "F32"
		case dtypes.Float16:
			name = "F16"
		default:
			return 0, fmt.Errorf("zinf generate: %q has dtype %s (allowed: float32, bfloat16, float16)", v.Name, v.Shape.DType)
		}
		offs[i] = end
		end = offs[i] + v.Shape.ByteSize()
		header[v.Name] = entry{DType: name, Shape: v.Shape.Dimensions, Offsets: []int64{offs[i], end}}
	}
	h, err := json.Marshal(header)
	if err != nil {
		return 0, err
	}
	hl := roundUp64(8+int64(len(h)), modelAlign) - 8
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return 0, fmt.Errorf("zinf generate: %w", err)
	}
	defer func() {
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			os.Remove(path) // ours: created above with O_EXCL
		}
	}()
	w := bufio.NewWriterSize(f, 1<<20)
	var n8 [8]byte
	binary.LittleEndian.PutUint64(n8[:], uint64(hl))
	w.Write(n8[:])
	w.Write(h)
	w.WriteString(strings.Repeat(" ", int(hl)-len(h)))
	elem := make([]float32, makeChunk)
	raw := make([]byte, 4*makeChunk)
	var at int64
	for i, v := range vars {
		if err := ctx.Err(); err != nil {
			return 0, err
		}
		for ; at < offs[i]; at++ {
			w.WriteByte(0)
		}
		r := newSplitMix(seed, v.Name)
		scale, fill := randomScale(v)
		size := v.Shape.DType.Size()
		for left := v.Numel(); left > 0; {
			k := min(left, makeChunk)
			if fill {
				for j := range elem[:k] {
					elem[j] = scale
				}
			} else {
				r.uniform(elem[:k], scale)
			}
			b := raw[:k*size]
			encode(v.Shape.DType, elem[:k], b)
			if _, err := w.Write(b); err != nil {
				return 0, fmt.Errorf("zinf generate: writing %s: %w", path, err)
			}
			left -= k
			at += int64(len(b))
		}
	}
	if err := w.Flush(); err != nil {
		return 0, fmt.Errorf("zinf generate: writing %s: %w", path, err)
	}
	return 8 + hl + at, nil
}

// randomScale is how WriteRandomModel fills v: uniform with this standard
// deviation, or (fill) every value this one.
func randomScale(v Var) (float32, bool) {
	d := v.Shape.Dimensions
	switch {
	case len(d) == 1 && strings.HasSuffix(v.Name, "/scale"):
		return 1, true
	case len(d) <= 1:
		return 0, true
	case strings.HasSuffix(v.Name, "/token_embed/embeddings"):
		return 1, false
	}
	return float32(1 / math.Sqrt(float64(d[0]))), false
}

func roundUp64(n, a int64) int64 { return (n + a - 1) / a * a }

// splitMix is SplitMix64, seeded from the seed and a tensor's name, so
// each tensor's values are its own whatever the order they are made in.
type splitMix struct{ s uint64 }

func newSplitMix(seed int64, name string) *splitMix {
	h := fnv.New64a()
	h.Write([]byte(name))
	return &splitMix{s: uint64(seed)*0x9e3779b97f4a7c15 ^ h.Sum64()}
}

func (r *splitMix) next() uint64 {
	r.s += 0x9e3779b97f4a7c15
	z := r.s
	z = (z ^ z>>30) * 0xbf58476d1ce4e5b9
	z = (z ^ z>>27) * 0x94d049bb133111eb
	return z ^ z>>31
}

// uniform fills dst with values uniform in [-std*sqrt(3), std*sqrt(3)).
func (r *splitMix) uniform(dst []float32, std float32) {
	a := std * float32(math.Sqrt(3)) * 2 / (1 << 24)
	off := std * float32(math.Sqrt(3))
	for i := 0; i < len(dst); i += 2 {
		x := r.next()
		dst[i] = float32(x>>40)*a - off
		if i+1 < len(dst) {
			dst[i+1] = float32(x>>16&(1<<24-1))*a - off
		}
	}
}

// encode writes src in dtype d, little-endian (bf16 rounded to nearest
// even).
func encode(d dtypes.DType, src []float32, dst []byte) {
	switch d {
	case dtypes.BFloat16:
		for i, f := range src {
			u := math.Float32bits(f)
			u += 0x7fff + (u >> 16 & 1)
			binary.LittleEndian.PutUint16(dst[2*i:], uint16(u>>16))
		}
	case dtypes.Float16:
		for i, f := range src {
			binary.LittleEndian.PutUint16(dst[2*i:], floatToHalf(f))
		}
	default:
		for i, f := range src {
			binary.LittleEndian.PutUint32(dst[4*i:], math.Float32bits(f))
		}
	}
}

// floatToHalf rounds f to IEEE half precision (toward zero in the
// mantissa: the values WriteRandomModel makes need no more).
func floatToHalf(f float32) uint16 {
	u := math.Float32bits(f)
	sign := uint16(u>>16) & 0x8000
	exp := int(u>>23&0xff) - 127 + 15
	frac := u & 0x7fffff
	switch {
	case exp <= 0:
		return sign
	case exp >= 31:
		return sign | 0x7c00
	}
	return sign | uint16(exp)<<10 | uint16(frac>>13)
}

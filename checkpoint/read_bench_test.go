package checkpoint

import (
	"context"
	"encoding/binary"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/zinfio/zinf/swapper"
)

// benchTotalBytes is the checkpoint size of BenchmarkReadTensor (256 MiB),
// or ZINF_BENCH_BYTES.
func benchTotalBytes() int64 {
	if v, err := strconv.ParseInt(os.Getenv("ZINF_BENCH_BYTES"), 10, 64); err == nil && v > 0 {
		return v
	}
	return 256 << 20
}

// benchTensors is total bytes of random float32 tensors of 32 MiB, in
// memory, in two files.
func benchTensors(total int64) State {
	rng := rand.NewChaCha8([32]byte{1})
	var files = []TensorFile{{Name: "params.safetensors"}, {Name: "optimizer.safetensors"}}
	for i := 0; total > 0; i++ {
		n := min(total, 32<<20) / 4
		buf := make([]byte, 4*n)
		rng.Read(buf)
		for j := range n {
			v := math.Float32frombits(binary.LittleEndian.Uint32(buf[4*j:]) & 0x3fffffff) // finite
			binary.LittleEndian.PutUint32(buf[4*j:], math.Float32bits(v))
		}
		files[i%2].Tensors = append(files[i%2].Tensors, FromBytes("layer."+strconv.Itoa(i), swapper.Float32, []int64{n}, buf))
		total -= 4 * n
	}
	return State{Step: 1, Ranks: []RankState{{Files: files}}}
}

// The save benchmarks (Save, SaveAsync, the naive writer, fio) are in
// cmd/zinf/internal/ckptbench.

// BenchmarkReadTensor reads the 256 MiB checkpoint back, tensor by tensor,
// with checksums.
func BenchmarkReadTensor(b *testing.B) {
	if testing.Short() {
		b.Skip("256 MiB benchmark skipped in -short mode")
	}
	total := benchTotalBytes()
	st := benchTensors(total)
	dir := filepath.Join(b.TempDir(), "step-1")
	if _, err := Save(context.Background(), dir, st, SaveOptions{}); err != nil {
		b.Fatal(err)
	}
	r, err := Open(dir)
	if err != nil {
		b.Fatal(err)
	}
	defer r.Close()
	dst := make([]byte, 32<<20)
	b.SetBytes(total)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		for _, ti := range r.Tensors() {
			if err := r.ReadTensor(context.Background(), ti.Name, dst[:ti.Bytes]); err != nil {
				b.Fatal(err)
			}
		}
	}
}

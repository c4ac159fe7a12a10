package ckptbench

import (
	"context"
	"encoding/binary"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/zinfio/zinf/checkpoint"
	"github.com/zinfio/zinf/swapper"
)

// benchTotalBytes is the checkpoint size of BenchmarkSave (256 MiB), or
// ZINF_BENCH_BYTES.
func benchTotalBytes() int64 {
	if v, err := strconv.ParseInt(os.Getenv("ZINF_BENCH_BYTES"), 10, 64); err == nil && v > 0 {
		return v
	}
	return 256 << 20
}

// benchTensors is total bytes of random float32 tensors of 32 MiB, in
// memory, in two files.
func benchTensors(total int64) (checkpoint.State, [][]float32) {
	rng := rand.NewChaCha8([32]byte{1})
	var files = []checkpoint.TensorFile{{Name: "params.safetensors"}, {Name: "optimizer.safetensors"}}
	var vals [][]float32
	for i := 0; total > 0; i++ {
		n := min(total, 32<<20) / 4
		buf := make([]byte, 4*n)
		rng.Read(buf)
		v := make([]float32, n)
		for j := range v {
			v[j] = math.Float32frombits(binary.LittleEndian.Uint32(buf[4*j:]) & 0x3fffffff) // finite
			binary.LittleEndian.PutUint32(buf[4*j:], math.Float32bits(v[j]))
		}
		vals = append(vals, v)
		files[i%2].Tensors = append(files[i%2].Tensors, checkpoint.FromBytes("layer."+strconv.Itoa(i), swapper.Float32, []int64{n}, buf))
		total -= 4 * n
	}
	return checkpoint.State{Step: 1, Ranks: []checkpoint.RankState{{Files: files}}}, vals
}

// BenchmarkSave compares writing one 256 MiB checkpoint (set
// ZINF_BENCH_BYTES for another size) with Save (pinned staging, O_DIRECT
// through the aio engine), with SaveAsync (snapshot, then drain; the time
// is until the commit) and with the naive Go way (encoding/binary through
// bufio into an os.File, then fsync). Every variant fsyncs. Run:
//
//	go test -run=NONE -bench=Save -benchtime=10x ./internal/ckptbench
func BenchmarkSave(b *testing.B) {
	if testing.Short() {
		b.Skip("256 MiB benchmark skipped in -short mode")
	}
	total := benchTotalBytes()
	st, vals := benchTensors(total)
	root := b.TempDir()
	ctx := context.Background()
	b.Run("zinf", func(b *testing.B) {
		w := checkpoint.NewWriter()
		defer w.Close()
		b.SetBytes(total)
		b.ReportAllocs()
		for i := 0; i < b.N; i++ {
			dir := filepath.Join(root, "step-"+strconv.Itoa(i))
			if _, err := w.Save(ctx, dir, st, checkpoint.SaveOptions{}); err != nil {
				b.Fatal(err)
			}
			b.StopTimer()
			os.RemoveAll(dir)
			b.StartTimer()
		}
	})
	b.Run("zinf-async", func(b *testing.B) {
		s := checkpoint.NewSaver(checkpoint.SaverOptions{})
		defer s.Close()
		b.SetBytes(total)
		b.ReportAllocs()
		var snap float64
		for i := 0; i < b.N; i++ {
			dir := filepath.Join(root, "async-"+strconv.Itoa(i))
			h, err := s.SaveAsync(ctx, dir, st, checkpoint.SaveOptions{})
			if err != nil {
				b.Fatal(err)
			}
			snap += h.SnapshotDuration().Seconds()
			if _, err := h.Wait(); err != nil {
				b.Fatal(err)
			}
			b.StopTimer()
			os.RemoveAll(dir)
			b.StartTimer()
		}
		b.ReportMetric(snap/float64(b.N)*1e3, "snapshot-ms/op")
	})
	b.Run("naive", func(b *testing.B) {
		b.SetBytes(total)
		b.ReportAllocs()
		for i := 0; i < b.N; i++ {
			path := filepath.Join(root, "naive-"+strconv.Itoa(i)+".safetensors")
			if _, err := naiveWrite(path, vals); err != nil {
				b.Fatal(err)
			}
			b.StopTimer()
			os.Remove(path)
			b.StartTimer()
		}
	})
}

// SaveBench and NaiveSaveBench (the CLI's) run and report sane figures.
func TestSaveBench(t *testing.T) {
	dir := t.TempDir()
	res, err := SaveBench(context.Background(), dir, 8<<20+6, checkpoint.SaveOptions{StagingBytes: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	if res.Bytes < 8<<20 || res.Seconds <= 0 || res.GBps <= 0 || res.Backend == "" {
		t.Fatalf("SaveBench = %+v", res)
	}
	naive, err := NaiveSaveBench(context.Background(), dir, 8<<20)
	if err != nil {
		t.Fatal(err)
	}
	if naive.Bytes < 8<<20 || naive.GBps <= 0 {
		t.Fatalf("NaiveSaveBench = %+v", naive)
	}
	t.Logf("zinf: %v; naive: %v", res, naive)
	entries, _ := os.ReadDir(dir)
	if len(entries) != 0 {
		t.Fatalf("SaveBench left %d entries", len(entries))
	}
}

// Package ckptbench measures checkpoint saves: SaveBench and
// NaiveSaveBench (zinf ckpt save-bench) time one save of synthetic tensors,
// CompareSave (zinf ckpt bench) holds Save against fio's O_DIRECT write of
// the same shape on the same directory, the naive Go writer and
// SaveAsync's stall, interleaved round by round. It uses only the
// checkpoint package's public API.
package ckptbench

import (
	"bufio"
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"time"

	"github.com/zinfio/zinf/aio"
	"github.com/zinfio/zinf/checkpoint"
	"github.com/zinfio/zinf/swapper"
)

// BenchResult is the outcome of SaveBench or NaiveSaveBench.
type BenchResult struct {
	Bytes   int64   // checkpoint bytes written (all files)
	Seconds float64 // wall time of the save, commit and fsyncs included
	GBps    float64 // Bytes / Seconds / 1e9
	// Backend and Direct describe the engine (empty for the naive writer).
	Backend string
	Direct  bool
}

func (r BenchResult) String() string {
	d := ""
	if r.Backend != "" {
		d = fmt.Sprintf(" (backend %s, O_DIRECT %v)", r.Backend, r.Direct)
	}
	return fmt.Sprintf("%d bytes in %.3f s: %.2f GB/s%s", r.Bytes, r.Seconds, r.GBps, d)
}

// benchTensorBytes is the size of each synthetic tensor: large, like a
// transformer layer's weights.
const benchTensorBytes = 64 << 20

// benchState builds a synthetic single-rank state of about totalBytes:
// float32 tensors spread over files (one per Parallel writer, at least one),
// whose bytes are copied out of a 1 MiB random pattern, so producing them
// costs a memcpy, as copying from a real tensor would, without holding
// totalBytes in memory. The pattern stays in the CPU caches; see
// benchStateWith.
func benchState(totalBytes int64, files int) checkpoint.State {
	return benchStateWith(totalBytes, files, 1<<20)
}

// benchStateWith is benchState with a pattern of patternBytes (a multiple
// of 8): one larger than the CPU caches makes producing a tensor read DRAM,
// as copying a real tensor does.
func benchStateWith(totalBytes int64, files, patternBytes int) checkpoint.State {
	pattern := make([]byte, max(8, patternBytes/8*8))
	rng := rand.New(rand.NewPCG(1, 2))
	for i := 0; i < len(pattern); i += 8 {
		binary.LittleEndian.PutUint64(pattern[i:], rng.Uint64())
	}
	read := func(_ context.Context, dst []byte, off int64) error {
		for len(dst) > 0 {
			p := off % int64(len(pattern))
			n := copy(dst, pattern[p:])
			dst = dst[n:]
			off += int64(n)
		}
		return nil
	}
	files = max(files, 1)
	tf := make([]checkpoint.TensorFile, files)
	for i := range tf {
		tf[i].Name = fmt.Sprintf("bench-%02d.safetensors", i)
	}
	for i, left := 0, totalBytes; left > 0; i++ {
		n := min(left, benchTensorBytes) / 4 * 4
		if n == 0 {
			break
		}
		t := checkpoint.FromFunc(fmt.Sprintf("layer.%d.weight", i), swapper.Float32, []int64{n / 4}, n, read)
		tf[i%files].Tensors = append(tf[i%files].Tensors, t)
		left -= n
	}
	return checkpoint.State{Step: 1, Ranks: []checkpoint.RankState{{Rank: 0, Files: tf}}}
}

// SaveBench measures Save on about totalBytes of synthetic float32 tensors
// written under dir (created if missing), with opts (Overwrite is forced,
// KeepLast ignored). The Writer's engine and pinned memory are set up by a
// small warm-up save first, as in a training job that keeps its Writer, so
// the figure is the save itself: staging, O_DIRECT writes, fdatasyncs, the
// manifests and the commit. The checkpoint is removed afterwards.
func SaveBench(ctx context.Context, dir string, totalBytes int64, opts checkpoint.SaveOptions) (BenchResult, error) {
	if totalBytes <= 0 {
		return BenchResult{}, errorf("totalBytes %d must be positive", totalBytes)
	}
	opts.EnsureDefaults()
	opts.Overwrite, opts.KeepLast = true, 0
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return BenchResult{}, err
	}
	// Without opts.Engine the Writer's own engine does the writes, as a
	// user gets it (checkpoint.WriterEngineOptions, its pinned memory
	// registered with it); an engine of the same options, made here, names
	// the backend and tells whether O_DIRECT applies.
	eng := opts.Engine
	if eng == nil {
		probe, err := aio.New(checkpoint.WriterEngineOptions(opts))
		if err != nil {
			return BenchResult{}, fmt.Errorf("ckptbench: creating the I/O engine: %w", err)
		}
		defer probe.Close()
		eng = probe
	}
	w := checkpoint.NewWriter()
	defer w.Close()
	files := opts.Parallel
	warm := filepath.Join(dir, "zinf-savebench-warmup")
	if _, err := w.Save(ctx, warm, benchState(int64(files)*int64(opts.StagingBytes), files), opts); err != nil {
		return BenchResult{}, err
	}
	os.RemoveAll(warm)
	target := filepath.Join(dir, "zinf-savebench")
	st := benchState(totalBytes, files)
	t0 := time.Now()
	m, err := w.Save(ctx, target, st, opts)
	secs := time.Since(t0).Seconds()
	if err != nil {
		return BenchResult{}, err
	}
	defer os.RemoveAll(target)
	var n int64
	for _, rm := range m.RankManifests {
		for _, f := range rm.Files {
			n += f.Bytes
		}
	}
	return BenchResult{Bytes: n, Seconds: secs, GBps: float64(n) / secs / 1e9, Backend: eng.Name(), Direct: aioDirect(eng, dir)}, nil
}

// aioDirect reports whether eng gets O_DIRECT on files in dir (a probe
// file, removed).
func aioDirect(eng aio.Engine, dir string) bool {
	path := filepath.Join(dir, ".zinf-savebench-probe")
	f, err := eng.Open(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return false
	}
	defer os.Remove(path)
	defer f.Close()
	return f.Direct()
}

// NaiveSaveBench measures the obvious Go way to write the same checkpoint
// (for comparison with SaveBench): each file through a bufio.Writer on an
// os.File, tensors encoded with encoding/binary, then fsync, sequentially.
// The files are removed afterwards.
func NaiveSaveBench(ctx context.Context, dir string, totalBytes int64) (BenchResult, error) {
	if totalBytes <= 0 {
		return BenchResult{}, errorf("totalBytes %d must be positive", totalBytes)
	}
	target := filepath.Join(dir, "zinf-savebench-naive")
	os.RemoveAll(target)
	if err := os.MkdirAll(target, 0o755); err != nil {
		return BenchResult{}, err
	}
	defer os.RemoveAll(target)
	st := benchState(totalBytes, 1)
	// The naive writer holds the tensors as []float32 in the Go heap.
	var tensors [][]float32
	for _, t := range st.Ranks[0].Files[0].Tensors {
		v := make([]float32, t.Bytes/4)
		var word [4]byte
		for i := range v {
			if err := t.Read(ctx, word[:], int64(4*i)); err != nil {
				return BenchResult{}, err
			}
			v[i] = math.Float32frombits(binary.LittleEndian.Uint32(word[:]))
		}
		tensors = append(tensors, v)
	}
	t0 := time.Now()
	n, err := naiveWrite(filepath.Join(target, "naive.safetensors"), tensors)
	secs := time.Since(t0).Seconds()
	if err != nil {
		return BenchResult{}, err
	}
	return BenchResult{Bytes: n, Seconds: secs, GBps: float64(n) / secs / 1e9}, nil
}

// naiveWrite writes a safetensors-like file the obvious way: bufio over
// os.File, binary.Write per tensor, fsync.
func naiveWrite(path string, tensors [][]float32) (int64, error) {
	f, err := os.Create(path)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	bw := bufio.NewWriterSize(f, 1<<20)
	header := []byte(`{"__metadata__":{"format":"pt"}}`)
	for len(header)%8 != 0 {
		header = append(header, ' ')
	}
	if err := binary.Write(bw, binary.LittleEndian, uint64(len(header))); err != nil {
		return 0, err
	}
	if _, err := bw.Write(header); err != nil {
		return 0, err
	}
	n := int64(8 + len(header))
	for _, t := range tensors {
		if err := binary.Write(bw, binary.LittleEndian, t); err != nil {
			return 0, err
		}
		n += int64(4 * len(t))
	}
	if err := bw.Flush(); err != nil {
		return 0, err
	}
	if err := f.Sync(); err != nil {
		return 0, err
	}
	return n, f.Close()
}

// errorf builds an error wrapping checkpoint.ErrInvalid, as the checkpoint
// package reports invalid options.
func errorf(format string, args ...any) error {
	return fmt.Errorf("%w: %s", checkpoint.ErrInvalid, fmt.Sprintf(format, args...))
}

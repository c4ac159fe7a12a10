package swapper_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/zinfio/zinf/aio"
	"github.com/zinfio/zinf/buffers"
	"github.com/zinfio/zinf/swapper"
)

func benchEnvInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}

func median(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	if len(s) == 0 {
		return 0
	}
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// BenchmarkStoreVsHandle compares the swap store with DeepNVMe's way of
// swapping, one file per tensor through an aio.Handle, on the same shape
// (ZINF_BENCH_TENSORS tensors, default 256, of ZINF_BENCH_TENSOR_MIB MiB,
// default 4; queue depth 8, 1 MiB blocks, the same pinned buffers,
// registered with both engines), in one run: each round writes every
// tensor through one then the other, then reads every tensor back the
// same way, all requests in flight at once and waited for together; which
// goes first alternates by round. Two untimed rounds first bring both to
// steady state (the store's copy-on-write extents and the handle's files
// allocated). Checksums are off in the store (the handle has none);
// ZINF_BENCH_CHECKSUMS=1 turns them on. Metrics: median GB/s of each, and
// store/handle as the median of the per-round ratios, per direction.
// ZINF_BENCH_DIR sets the directory, ZINF_BENCH_ROUNDS the timed rounds
// (default 10; an odd number is rounded up).
func BenchmarkStoreVsHandle(b *testing.B) {
	if testing.Short() {
		b.Skip("moves gigabytes")
	}
	tensors := benchEnvInt("ZINF_BENCH_TENSORS", 256)
	size := benchEnvInt("ZINF_BENCH_TENSOR_MIB", 4) << 20
	// An even number, so that each goes first as often as the other:
	// on this disk whichever writes second is faster.
	rounds := benchEnvInt("ZINF_BENCH_ROUNDS", 10)
	if rounds%2 == 1 {
		rounds++
	}
	sums := os.Getenv("ZINF_BENCH_CHECKSUMS") == "1"
	dir := os.Getenv("ZINF_BENCH_DIR")
	if dir == "" {
		dir = b.TempDir()
	}
	ctx := context.Background()
	for i := 0; i < b.N; i++ {
		opts := aio.Options{QueueDepth: 8, BlockSizeBytes: 1 << 20, Logger: quiet}
		se, err := aio.New(opts)
		if err != nil {
			b.Fatal(err)
		}
		h, err := aio.NewHandle(opts)
		if err != nil {
			b.Fatal(err)
		}
		pool, err := buffers.NewPool(buffers.Options{CapacityBytes: int64(tensors * size), Logger: quiet})
		if err != nil {
			b.Fatal(err)
		}
		_ = pool.Register(se)
		_ = pool.Register(h.Engine())
		bufs := make([][]byte, tensors)
		for k := range bufs {
			buf, err := pool.Acquire(ctx, size, buffers.PurposeParams)
			if err != nil {
				b.Fatal(err)
			}
			defer buf.Release()
			bufs[k] = buf.Bytes()
			for j := 0; j < size; j += 4096 {
				bufs[k][j] = byte(k + j>>12)
			}
		}
		store, err := swapper.OpenStore(swapper.StoreOptions{Paths: []string{dir}, Engine: se, Name: "bench", Checksums: sums, Logger: quiet})
		if err != nil {
			b.Fatal(err)
		}
		hdir, err := os.MkdirTemp(dir, "handle-")
		if err != nil {
			b.Fatal(err)
		}
		name := func(k int) string { return fmt.Sprint("t", k) }
		path := func(k int) string { return filepath.Join(hdir, fmt.Sprintf("t%d.swp", k)) }
		pend := make([]*swapper.Pending, tensors)
		storeOp := func(write bool) time.Duration {
			t0 := time.Now()
			for k := range tensors {
				var err error
				if write {
					pend[k], err = store.WriteAsync(name(k), bufs[k])
				} else {
					pend[k], err = store.ReadAsync(name(k), bufs[k])
				}
				if err != nil {
					b.Fatal(err)
				}
			}
			for _, p := range pend {
				if err := p.Wait(); err != nil {
					b.Fatal(err)
				}
			}
			return time.Since(t0)
		}
		handleOp := func(write bool) time.Duration {
			t0 := time.Now()
			for k := range tensors {
				var err error
				if write {
					err = h.AsyncPwrite(bufs[k], path(k), 0)
				} else {
					err = h.AsyncPread(bufs[k], path(k), 0)
				}
				if err != nil {
					b.Fatal(err)
				}
			}
			if n, err := h.Wait(); err != nil || n != tensors {
				b.Fatalf("handle wait: %d, %v", n, err)
			}
			return time.Since(t0)
		}
		bytes := float64(tensors * size)
		var sw, hw, sr, hr, rw, rr []float64
		for round := -2; round < rounds; round++ {
			storeFirst := round%2 == 0
			var tsw, thw, tsr, thr time.Duration
			if storeFirst {
				tsw, thw = storeOp(true), handleOp(true)
				tsr, thr = storeOp(false), handleOp(false)
			} else {
				thw, tsw = handleOp(true), storeOp(true)
				thr, tsr = handleOp(false), storeOp(false)
			}
			if round < 0 {
				continue
			}
			g := func(d time.Duration) float64 { return bytes / d.Seconds() / 1e9 }
			sw, hw, sr, hr = append(sw, g(tsw)), append(hw, g(thw)), append(sr, g(tsr)), append(hr, g(thr))
			rw, rr = append(rw, thw.Seconds()/tsw.Seconds()), append(rr, thr.Seconds()/tsr.Seconds())
			b.Logf("round %d (%s first): write store %.3f handle %.3f GB/s (%.3f); read store %.3f handle %.3f GB/s (%.3f)",
				round+1, map[bool]string{true: "store", false: "handle"}[storeFirst], g(tsw), g(thw), rw[len(rw)-1], g(tsr), g(thr), rr[len(rr)-1])
		}
		st := se.Stats()
		b.Logf("store engine: %d pieces, %d with registered buffers, %d with fixed files; handle engine: %+v",
			st.Pieces, st.FixedBufferPieces, st.FixedFilePieces, h.Engine().Stats())
		store.Close()
		h.Close()
		se.Close()
		os.RemoveAll(hdir)
		b.ReportMetric(median(sw), "store-write-GB/s")
		b.ReportMetric(median(hw), "handle-write-GB/s")
		b.ReportMetric(median(rw), "x-write")
		b.ReportMetric(median(sr), "store-read-GB/s")
		b.ReportMetric(median(hr), "handle-read-GB/s")
		b.ReportMetric(median(rr), "x-read")
	}
}

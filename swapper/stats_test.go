package swapper_test

import (
	"context"
	"fmt"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/zinfio/zinf/aio"
	"github.com/zinfio/zinf/buffers"
	"github.com/zinfio/zinf/internal/test/faults"
	"github.com/zinfio/zinf/swapper"
	"github.com/zinfio/zinf/trace"
)

// TestStoreStatsPerPathAndLatency writes and reads tensors of odd sizes on
// one to three striped paths and checks the per-path device bytes against
// the striping computed here (chunk k of the padded tensor on path k mod
// n), the latency histograms against the operations done, and the trace
// events (one per operation, with its bytes and a span inside the call); a
// write that fails (ENOSPC) is traced as failed and counted nowhere.
func TestStoreStatsPerPathAndLatency(t *testing.T) {
	for _, paths := range []int{1, 2, 3} {
		t.Run(fmt.Sprintf("paths=%d", paths), func(t *testing.T) {
			inj := faults.New(1)
			e, err := aio.New(aio.Options{BlockSizeBytes: 256 << 10, QueueDepth: 8, Faults: inj, Logger: quiet})
			if err != nil {
				t.Fatal(err)
			}
			defer e.Close()
			pool, err := buffers.NewPool(buffers.Options{CapacityBytes: 64 << 20, Logger: quiet})
			if err != nil {
				t.Fatal(err)
			}
			defer pool.Close()
			var dirs []string
			for range paths {
				dirs = append(dirs, t.TempDir())
			}
			var mu sync.Mutex
			var events []trace.Event
			sink := trace.Func(func(ev trace.Event) { mu.Lock(); events = append(events, ev); mu.Unlock() })
			const stripe = 64 << 10
			s, err := swapper.OpenStore(swapper.StoreOptions{Paths: dirs, Engine: e, StripeBytes: stripe, Logger: quiet, Trace: sink})
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			sizes := []int{1, 4095, stripe + 7, 5*stripe - 3, 1 << 20}
			want := make([]swapper.PathStats, paths)
			add := func(n int, write bool) {
				padded := s.PaddedLen(int64(n))
				st := s.StripeBytes()
				touched := make([]bool, paths)
				for k, lo := 0, int64(0); lo < padded; k, lo = k+1, lo+st {
					c := min(st, padded-lo)
					if write {
						want[k%paths].BytesWritten += c
					} else {
						want[k%paths].BytesRead += c
					}
					touched[k%paths] = true
				}
				// One request per chunk on several paths; one per
				// tensor on a single path.
				for p := range paths {
					reqs := int64(0)
					if paths == 1 {
						reqs = 1
					} else {
						for k, lo := 0, int64(0); lo < padded; k, lo = k+1, lo+st {
							if k%paths == p {
								reqs++
							}
						}
					}
					if !touched[p] {
						continue
					}
					if write {
						want[p].Writes += reqs
					} else {
						want[p].Reads += reqs
					}
				}
			}
			ctx := context.Background()
			before := time.Now()
			for i, n := range sizes {
				b, err := pool.Acquire(ctx, int(s.PaddedLen(int64(n))), buffers.PurposeStaging)
				if err != nil {
					t.Fatal(err)
				}
				if err := s.Write(ctx, fmt.Sprint("t", i), b.Bytes()[:n]); err != nil {
					t.Fatal(err)
				}
				add(n, true)
				if err := s.Read(ctx, fmt.Sprint("t", i), b.Bytes()[:n]); err != nil {
					t.Fatal(err)
				}
				add(n, false)
				b.Release()
			}
			// A failed write: counted as an error, not in the paths.
			inj.Add(faults.Rule{Kind: faults.Writes, Err: syscall.ENOSPC})
			b, _ := pool.Acquire(ctx, 1<<20, buffers.PurposeStaging)
			if err := s.Write(ctx, "full", b.Bytes()[:1<<20]); err == nil {
				t.Fatal("write under ENOSPC succeeded")
			}
			b.Release()
			after := time.Now()
			st := s.Stats()
			for p := range paths {
				want[p].Path = dirs[p]
				if st.Paths[p] != want[p] {
					t.Errorf("path %d: %+v, want %+v", p, st.Paths[p], want[p])
				}
			}
			for what, l := range map[string]swapper.Latency{"read": st.ReadLatency, "write": st.WriteLatency} {
				var n int64
				for _, c := range l.Buckets {
					n += c
				}
				if l.Count != int64(len(sizes)) || n != l.Count || l.Sum <= 0 || l.Sum > after.Sub(before) {
					t.Errorf("%s latency: count %d (buckets %d), sum %v; want %d operations within %v", what, l.Count, n, l.Sum, len(sizes), after.Sub(before))
				}
				if q := l.Quantile(1); q < l.Sum/time.Duration(l.Count) {
					t.Errorf("%s: the maximum's bucket bound %v is below the mean %v", what, q, l.Sum/time.Duration(l.Count))
				}
			}
			if len(events) != 2*len(sizes)+1 {
				t.Fatalf("%d trace events, want %d", len(events), 2*len(sizes)+1)
			}
			for i, ev := range events {
				wantKind, n, failed := trace.Write, sizes[min(i/2, len(sizes)-1)], false
				if i%2 == 1 {
					wantKind = trace.Read
				}
				if i == len(events)-1 {
					wantKind, n, failed = trace.Write, 1<<20, true
				}
				if ev.Kind != wantKind || ev.Bytes != int64(n) || ev.Failed != failed || ev.Start.Before(before) || ev.End.After(after) || ev.End.Before(ev.Start) {
					t.Errorf("event %d: %+v, want %v of %d bytes (failed %v) within the calls", i, ev, wantKind, n, failed)
				}
			}
		})
	}
}

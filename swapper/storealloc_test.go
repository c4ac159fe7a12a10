package swapper_test

import (
	"bytes"
	"context"
	"testing"

	"github.com/zinfio/zinf/aio"
)

// TestStoreOpsReuseRequests: a single-path store's warm write, read and
// ranged read reuse their engine requests (completion channel and slice
// table), on every backend; the bytes still round-trip. The bound is the
// store's own bookkeeping per op (the Pending, the new version and its
// extents), well below what a fresh request per op costs.
func TestStoreOpsReuseRequests(t *testing.T) {
	for _, backend := range []string{aio.BackendPosix, aio.BackendAuto} {
		t.Run(backend, func(t *testing.T) {
			r := newRig(t, 1, false, backend)
			ctx := context.Background()
			const n = 64 << 10
			src := r.buf(t, n, 3).Bytes()[:n]
			dst := r.buf(t, n, 0).Bytes()[:n]
			rng := r.buf(t, n, 0)
			cycle := func() {
				if err := r.store.Write(ctx, "w", src); err != nil {
					t.Fatal(err)
				}
				if err := r.store.Read(ctx, "w", dst); err != nil {
					t.Fatal(err)
				}
				p, data, err := r.store.ReadRangeAsync("w", 4096, 8192, rng.Bytes())
				if err != nil {
					t.Fatal(err)
				}
				if err := p.Wait(); err != nil {
					t.Fatal(err)
				}
				if !bytes.Equal(data, src[4096:8192]) {
					t.Fatal("ranged read differs")
				}
			}
			for range 4 {
				cycle() // warm the request pool
			}
			allocs := testing.AllocsPerRun(50, cycle)
			if !bytes.Equal(dst, src) {
				t.Fatal("read differs from write")
			}
			t.Logf("%s: %.1f allocations per write + read + ranged read", backend, allocs)
			if allocs > 8 {
				t.Errorf("%.1f allocations per write + read + ranged read, want at most 8 (14 with a fresh request per op)", allocs)
			}
		})
	}
}

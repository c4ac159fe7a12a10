package swapper_test

import (
	"bytes"
	"context"
	"fmt"
	"testing"

	"github.com/zinfio/zinf/aio"
)

// TestPieceWriter writes tensors piece by piece (pieces of one and of
// several stripe units, an odd tail) over one to three paths, with and
// without checksums: nothing is visible before Commit, the previous
// version stays readable until then, whole and ranged reads (checksums
// verified) give the bytes written, an aborted writer leaves the previous
// version, and pieces out of shape are refused.
func TestPieceWriter(t *testing.T) {
	for _, paths := range []int{1, 3} {
		for _, sums := range []bool{false, true} {
			t.Run(fmt.Sprintf("paths=%d/checksums=%v", paths, sums), func(t *testing.T) {
				r := newRig(t, paths, sums, aio.BackendAuto)
				ctx := context.Background()
				u := int(r.store.PieceUnit())
				n := 5*u + 12345
				old := r.buf(t, n, 1)
				if err := r.store.Write(ctx, "w", old.Bytes()[:n]); err != nil {
					t.Fatal(err)
				}
				want := r.buf(t, n, 7).Bytes()[:n]
				w, err := r.store.NewPieceWriter("w", int64(n))
				if err != nil {
					t.Fatal(err)
				}
				if _, err := w.WriteAsync(r.buf(t, u+1, 0).Bytes()[:u+1]); err == nil {
					t.Fatal("a piece that is not a multiple of the unit was accepted")
				}
				for _, size := range []int{u, 2 * u, 2*u + 12345} {
					at := map[int]int{u: 0, 2 * u: u, 2*u + 12345: 3 * u}[size]
					b := r.buf(t, size, 0)
					copy(b.Bytes(), want[at:at+size])
					p, err := w.WriteAsync(b.Bytes()[:size])
					if err != nil {
						t.Fatal(err)
					}
					if err := p.Wait(); err != nil {
						t.Fatal(err)
					}
					got := r.buf(t, n, 0).Bytes()[:n]
					if err := r.store.Read(ctx, "w", got); err != nil {
						t.Fatal(err)
					}
					if !bytes.Equal(got, old.Bytes()[:n]) {
						t.Fatal("the version being written is visible before Commit")
					}
				}
				if err := w.Commit(); err != nil {
					t.Fatal(err)
				}
				got := r.buf(t, n, 0).Bytes()[:n]
				if err := r.store.Read(ctx, "w", got); err != nil {
					t.Fatal(err)
				}
				if !bytes.Equal(got, want) {
					t.Fatal("committed version differs from the pieces written")
				}
				rb := r.buf(t, int(r.store.RangeLen(int64(u-3), int64(3*u+9))), 0)
				data, err := r.store.ReadRange(ctx, "w", int64(u-3), int64(3*u+9), rb.Bytes())
				if err != nil || !bytes.Equal(data, want[u-3:3*u+9]) {
					t.Fatalf("ranged read: %v (equal %v)", err, bytes.Equal(data, want[u-3:3*u+9]))
				}
				// An aborted writer leaves the committed version.
				w2, err := r.store.NewPieceWriter("w", int64(n))
				if err != nil {
					t.Fatal(err)
				}
				p, err := w2.WriteAsync(r.buf(t, u, 9).Bytes()[:u])
				if err != nil {
					t.Fatal(err)
				}
				if err := p.Wait(); err != nil {
					t.Fatal(err)
				}
				if err := w2.Commit(); err == nil {
					t.Fatal("a writer with bytes missing committed")
				}
				w2.Abort()
				if err := r.store.Read(ctx, "w", got); err != nil || !bytes.Equal(got, want) {
					t.Fatalf("after abort: %v", err)
				}
				if _, err := w2.WriteAsync(r.buf(t, u, 0).Bytes()[:u]); err == nil {
					t.Fatal("an aborted writer took a piece")
				}
				if err := w2.Commit(); err == nil {
					t.Fatal("an aborted writer committed")
				}
			})
		}
	}
}

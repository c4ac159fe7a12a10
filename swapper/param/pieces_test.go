package param

import (
	"testing"

	"github.com/zinfio/zinf/buffers"
	"github.com/zinfio/zinf/swapper"
)

// TestStreamedPieces: with Options.PieceBytes a partition four times a
// piece lives in a pool smaller than itself: Init writes it piece by
// piece, Wait passes it by, whole reads and spans (any order, cut by
// pieces) read it from the store, StageRange in sub-group ranges stages
// an update that commits as StageUpdate's would, and a StageRange given
// up half way (DiscardUpdates) leaves the old values and no buffer held.
// A small partition alongside is staged by ranges too (in one pinned
// buffer, not the Go heap).
func TestStreamedPieces(t *testing.T) {
	for _, dt := range []swapper.DType{swapper.Float32, swapper.BFloat16} {
		t.Run(dt.String(), func(t *testing.T) {
			ctx := testCtx(t)
			e := newEnv(t, envOpts{poolBytes: 3 << 20, checksums: true})
			s := e.swapper(t, Options{DType: dt, PieceBytes: 1 << 20})
			n := 4*(1<<20)/dt.Size() + 12345
			if err := s.Register("big", n, swapper.TierNVMe); err != nil {
				t.Fatal(err)
			}
			if err := s.Register("small", 1000, swapper.TierNVMe); err != nil {
				t.Fatal(err)
			}
			if !s.Streamed("big") || s.Streamed("small") {
				t.Fatalf("streamed: big %v, small %v", s.Streamed("big"), s.Streamed("small"))
			}
			v0, s0 := values(1, n), values(2, 1000)
			if err := s.Init(ctx, "big", v0); err != nil {
				t.Fatal(err)
			}
			if err := s.Init(ctx, "small", s0); err != nil {
				t.Fatal(err)
			}
			if err := s.SwapIn(ctx, "big", "small"); err != nil {
				t.Fatal(err)
			}
			sameBits(t, "big after init", read(t, s, "big"), expect(dt, v0))
			s.Release("big", "small")
			spans := []Span{{n - 5, n}, {0, 3}, {1<<20/dt.Size() - 2, 3<<20/dt.Size() + 7}, {0, 3}}
			total := 0
			for _, sp := range spans {
				total += sp.Hi - sp.Lo
			}
			got := make([]byte, total*4)
			if err := s.ReadSpansAs(ctx, "big", spans, swapper.Float32, got); err != nil {
				t.Fatal(err)
			}
			all := expect(dt, v0)
			at := 0
			for _, sp := range spans {
				want := make([]byte, (sp.Hi-sp.Lo)*4)
				buffers.Encode(swapper.Float32, want, all[sp.Lo:sp.Hi])
				if string(got[at:at+len(want)]) != string(want) {
					t.Fatalf("span %v differs", sp)
				}
				at += len(want)
			}
			stage := func(name string, v []float32, upTo int) {
				const sg = 65537
				for lo := 0; lo < len(v) && lo < upTo; lo += sg {
					w, err := s.StageRange(ctx, name, lo, len(v), v[lo:min(lo+sg, len(v))])
					if err != nil {
						t.Fatal(err)
					}
					if err := w.Wait(); err != nil {
						t.Fatal(err)
					}
				}
			}
			// Given up half way: nothing changes.
			stage("big", values(3, n), n/2)
			s.DiscardUpdates()
			sameBits(t, "big after a discarded update", read(t, s, "big"), expect(dt, v0))
			v1, s1 := values(4, n), values(5, 1000)
			stage("big", v1, n)
			stage("small", s1, 1000)
			sameBits(t, "big before commit", read(t, s, "big"), expect(dt, v0))
			if err := s.CommitUpdates(); err != nil {
				t.Fatal(err)
			}
			sameBits(t, "big after commit", read(t, s, "big"), expect(dt, v1))
			if err := s.SwapIn(ctx, "small"); err != nil {
				t.Fatal(err)
			}
			sameBits(t, "small after commit", read(t, s, "small"), expect(dt, s1))
			s.Release("small")
			if _, err := s.StageRange(ctx, "big", 5, n, v1[5:9]); err == nil {
				t.Fatal("a range out of order was accepted")
			}
		})
	}
}

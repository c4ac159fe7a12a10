package grad_test

import (
	"context"
	"errors"
	"log/slog"
	"math"
	"math/rand/v2"
	"syscall"
	"testing"
	"time"

	"github.com/zinfio/zinf/aio"
	"github.com/zinfio/zinf/internal/test/faults"
	"github.com/zinfio/zinf/swapper"
	"github.com/zinfio/zinf/swapper/grad"
)

// TestReportedFailureDoesNotStrandOthers: in a pool of exactly
// PinnedNeedBytes, a write-behind fails (ENOSPC) and its failure is
// reported by a Read (as the optimizer's read of a handed-over gradient
// does) while its pinned copy waits to be written again. The next
// gradient's Accumulate must not wait forever for that memory: once space
// returns it writes the kept copy again and goes on, and nothing is lost.
// (The metamorphic test found this: the copy was only rewritten by the
// next operation on its own tensor or by Flush, so another tensor's
// Accumulate waited until the pool's stall timeout.)
func TestReportedFailureDoesNotStrandOthers(t *testing.T) {
	for _, reportBy := range []string{"read", "read-range", "accumulate-retry"} {
		t.Run(reportBy, func(t *testing.T) {
			quiet := slog.New(slog.DiscardHandler)
			inj := faults.New(1)
			eng, err := aio.New(aio.Options{Backend: aio.BackendPosix, Faults: inj, Logger: quiet})
			if err != nil {
				t.Fatal(err)
			}
			defer eng.Close()
			st, err := swapper.OpenStore(swapper.StoreOptions{Paths: []string{t.TempDir()}, Engine: eng, Name: "reported", Logger: quiet})
			if err != nil {
				t.Fatal(err)
			}
			defer st.Close()
			parts := []int{5000, 3000}
			need := grad.PinnedNeedBytes(grad.Options{Store: st, Pool: newPool(t, 1<<20)}, parts, nil)
			pool := newPool(t, need)
			g, err := grad.New(grad.Options{Store: st, Pool: pool, Logger: quiet})
			if err != nil {
				t.Fatal(err)
			}
			defer g.Close()
			ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
			defer cancel()
			defer func() {
				if ctx.Err() != nil {
					t.Errorf("watchdog: pool of %d bytes: %s; stats %+v", need, pool.Holders(), g.Stats())
				}
			}()
			g.Register("a", parts[0])
			g.Register("b", parts[1])
			rng := rand.New(rand.NewPCG(3, 4))
			a, b := randGrad(rng, parts[0]), randGrad(rng, parts[1])

			inj.Add(faults.Rule{Kind: faults.Writes, Err: syscall.ENOSPC})
			if err := g.Accumulate(ctx, "a", a); err != nil {
				t.Fatal(err) // behind: nothing to report yet
			}
			// The failure is reported, and the copy stays pinned.
			switch reportBy {
			case "read":
				err = g.Read(ctx, "a", make([]float32, parts[0]))
			case "read-range":
				buf, aerr := pool.Acquire(ctx, g.RangeBufferBytes(0, 100), 0)
				if aerr != nil {
					t.Fatal(aerr)
				}
				_, err = g.ReadRange(ctx, "a", 0, 100, buf.Bytes())
				buf.Release()
			case "accumulate-retry":
				err = g.Accumulate(ctx, "a", a)
			}
			if !errors.Is(err, aio.ErrNoSpace) {
				t.Fatalf("the failure was not reported by %s: %v", reportBy, err)
			}
			inj.Clear() // space returns
			if err := g.Accumulate(ctx, "b", b); err != nil {
				t.Fatalf("accumulate b after a's reported failure: %v", err)
			}
			if err := g.Flush(ctx); err != nil {
				t.Fatal(err)
			}
			for name, want := range map[string][]float32{"a": a, "b": b} {
				got := make([]float32, len(want))
				if err := g.Read(ctx, name, got); err != nil {
					t.Fatal(err)
				}
				for i := range got {
					if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
						t.Fatalf("%s[%d] = %v, want %v", name, i, got[i], want[i])
					}
				}
			}
		})
	}
}

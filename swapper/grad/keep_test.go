package grad_test

import (
	"context"
	"math"
	"testing"

	"github.com/zinfio/zinf/swapper/grad"
)

// TestKeepByName: gradients Options.Keep names stay in pinned memory from
// Register on, whatever the order of registration and with no
// KeepInCPUBytes budget, and are not cut into pieces: their sums over
// several Accumulate calls are read back (Read and the optimizer's
// ReadRange) bit for bit without a store write or read, Flush and Zero
// write nothing, and the next step reuses the buffer. A gradient not
// named takes the store's round trip.
func TestKeepByName(t *testing.T) {
	ctx := context.Background()
	s, st, _ := holdEnvWith(t, 1<<20, grad.Options{SumSquares: true, PieceElems: 256,
		Keep: func(name string) bool { return name == "kept" }})
	const n = 1000 // longer than a piece
	for _, name := range []string{"other", "kept"} {
		if err := s.Register(name, n); err != nil {
			t.Fatal(err)
		}
	}
	if g := s.Stats(); g.KeptNamed != 1 || g.KeptNamedBytes != 4*n || g.KeptBytes != 0 {
		t.Fatalf("stats after Register: %+v; want one gradient of %d bytes kept by name", g, 4*n)
	}
	for step := range 2 {
		want := make([]float32, n)
		for micro := range 3 {
			g := make([]float32, n)
			for i := range g {
				g[i] = float32(math.Sin(float64(i*7+micro+step*31))) * 0.25
				want[i] += g[i]
			}
			for _, name := range []string{"kept", "other"} {
				if err := s.Accumulate(ctx, name, g); err != nil {
					t.Fatal(err)
				}
			}
		}
		if err := s.Flush(ctx); err != nil {
			t.Fatal(err)
		}
		before := st.Stats()
		for _, name := range []string{"kept", "other"} {
			got := make([]float32, n)
			if err := s.Read(ctx, name, got); err != nil {
				t.Fatal(err)
			}
			dst := make([]byte, s.RangeBufferBytes(256, 512))
			part, err := s.ReadRange(ctx, name, 256, 512, dst)
			if err != nil {
				t.Fatal(err)
			}
			for i := range want {
				if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
					t.Fatalf("step %d %s[%d] = %v, want %v", step, name, i, got[i], want[i])
				}
			}
			for i, v := range part {
				if math.Float32bits(v) != math.Float32bits(want[256+i]) {
					t.Fatalf("step %d %s range [256, 512) at %d = %v, want %v", step, name, i, v, want[256+i])
				}
			}
		}
		after := st.Stats()
		if after.BytesRead == before.BytesRead {
			t.Errorf("step %d: the gradient not kept was read without the store", step)
		}
		s.Zero()
	}
	g := s.Stats()
	// Only "other" went to the store: four pieces a micro-batch.
	if g.BytesWritten != 2*3*4*n || g.ServedReads+g.Reads == 0 {
		t.Errorf("store traffic %+v; want %d bytes written (the gradient not kept, 3 micro-batches, 2 steps)", g, 2*3*4*n)
	}
}

// TestKeepByNameWithoutRoom: a gradient named by Options.Keep for which
// the pool has no room at Register is registered all the same, to take the
// store's round trip (with a warning), instead of failing Register.
func TestKeepByNameWithoutRoom(t *testing.T) {
	s, _, _ := holdEnvWith(t, 64<<10, grad.Options{Keep: func(string) bool { return true }})
	const n = 6 << 10 // 24 KiB in 32 KiB blocks: two fill the 64 KiB pool
	for _, name := range []string{"a", "b", "c"} {
		if err := s.Register(name, n); err != nil {
			t.Fatal(err)
		}
	}
	if g := s.Stats(); g.KeptNamed != 2 || g.KeptNamedBytes != 2*4*n {
		t.Fatalf("%d gradients kept by name in a 64 KiB pool, want 2 (%+v)", g.KeptNamed, g)
	}
	got := make([]float32, n)
	got[0] = 1
	if err := s.Read(context.Background(), "c", got); err != nil || got[0] != 0 {
		t.Fatalf("read of the gradient not kept, nothing accumulated: %v, [0] = %v", err, got[0])
	}
}

// TestKeepByNameTooLarge: a gradient named by Options.Keep larger than the
// pool's largest buffer is kept in pieces on the store instead of failing
// Register, and its sum is right.
func TestKeepByNameTooLarge(t *testing.T) {
	s, _, _ := holdEnvWith(t, 64<<10, grad.Options{PieceElems: 1024, Keep: func(string) bool { return true }})
	const n = 32 << 10 // 128 KiB: larger than the 64 KiB pool
	if err := s.Register("big", n); err != nil {
		t.Fatalf("Register of a named gradient larger than the pool: %v", err)
	}
	if g := s.Stats(); g.KeptNamed != 0 {
		t.Fatalf("kept by name: %+v", g)
	}
	ctx := context.Background()
	g := make([]float32, n)
	for i := range g {
		g[i] = float32(i % 97)
	}
	for range 2 {
		if err := s.Accumulate(ctx, "big", g); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	got := make([]float32, n)
	if err := s.Read(ctx, "big", got); err != nil {
		t.Fatal(err)
	}
	for i := range g {
		if got[i] != 2*g[i] {
			t.Fatalf("big[%d] = %v, want %v", i, got[i], 2*g[i])
		}
	}
}

package buffers_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/zinfio/zinf/buffers"
)

// A purpose with a reservation is served from its own region: another
// purpose filling the shared region cannot make it wait, and it cannot
// take more than its share.
func TestReservationsIsolatePurposes(t *testing.T) {
	var res [buffers.NumPurposes]int64
	res[buffers.PurposeOptimizer] = 64 << 10
	p, err := buffers.NewPool(buffers.Options{CapacityBytes: 128 << 10, Reservations: res, Pin: buffers.PinOff})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if got := p.ReservedBytes(buffers.PurposeOptimizer); got != 64<<10 {
		t.Fatalf("ReservedBytes = %d, want %d", got, 64<<10)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	shared, err := p.Acquire(ctx, 64<<10, buffers.PurposeParams) // the whole shared region
	if err != nil {
		t.Fatal(err)
	}
	defer shared.Release()
	if _, ok := p.TryAcquire(4096, buffers.PurposeGradients); ok {
		t.Fatal("the shared region is full, yet a shared purpose got a buffer")
	}
	opt, err := p.Acquire(ctx, 64<<10, buffers.PurposeOptimizer)
	if err != nil {
		t.Fatalf("the optimizer's reservation is free but Acquire failed: %v", err)
	}
	opt.Release()
	_, err = p.Acquire(ctx, 128<<10, buffers.PurposeOptimizer)
	if !errors.Is(err, buffers.ErrTooLarge) || !strings.Contains(err.Error(), "optimizer reservation") {
		t.Fatalf("a request above the reservation: got %v, want ErrTooLarge naming the reservation", err)
	}
	if st := p.Stats(); st.ReservedBytes[buffers.PurposeOptimizer] != 64<<10 || st.FreeBytes != 64<<10 {
		t.Fatalf("stats: %+v", st)
	}
}

func TestReservationsBeyondCapacityRefused(t *testing.T) {
	var res [buffers.NumPurposes]int64
	res[buffers.PurposeParams] = 96 << 10
	res[buffers.PurposeGradients] = 64 << 10
	_, err := buffers.NewPool(buffers.Options{CapacityBytes: 128 << 10, Reservations: res, Pin: buffers.PinOff})
	if err == nil || !strings.Contains(err.Error(), "Reservations") {
		t.Fatalf("got %v, want an error naming Options.Reservations", err)
	}
}

// A waiter whose region sees no release fails with ErrStalled naming the
// holders, even with a context that never ends.
func TestStalledAcquireNamesHolders(t *testing.T) {
	p, err := buffers.NewPool(buffers.Options{CapacityBytes: 64 << 10, Pin: buffers.PinOff, StallTimeout: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	held, err := p.Acquire(context.Background(), 48<<10, buffers.PurposeGradients)
	if err != nil {
		t.Fatal(err)
	}
	defer held.Release()
	done := make(chan error, 1)
	go func() {
		_, err := p.Acquire(context.Background(), 32<<10, buffers.PurposeOptimizer)
		done <- err
	}()
	select {
	case err := <-done:
		if !errors.Is(err, buffers.ErrStalled) {
			t.Fatalf("got %v, want ErrStalled", err)
		}
		for _, want := range []string{"gradients 48 KiB", "1 waiting", "32 KiB (32768 bytes) for optimizer"} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("stall error %q does not name %q", err, want)
			}
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("Acquire still waiting after 10 s; holders: %s", p.Holders())
	}
	if p.Stats().Stalls != 1 {
		t.Fatalf("Stalls = %d, want 1", p.Stats().Stalls)
	}
}

// A waiter that sees releases keeps waiting past the stall timeout: the
// watchdog fails only waits that make no progress.
func TestSlowProgressIsNotAStall(t *testing.T) {
	p, err := buffers.NewPool(buffers.Options{CapacityBytes: 64 << 10, Pin: buffers.PinOff, StallTimeout: 150 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	var held []*buffers.Buffer
	for range 16 {
		b, err := p.Acquire(t.Context(), 4096, buffers.PurposeParams)
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, b)
	}
	go func() {
		for _, b := range held {
			time.Sleep(50 * time.Millisecond)
			b.Release()
		}
	}()
	b, err := p.Acquire(t.Context(), 64<<10, buffers.PurposeParams)
	if err != nil {
		t.Fatalf("a wait that saw releases every 50 ms failed: %v", err)
	}
	b.Release()
}

func TestBlockRule(t *testing.T) {
	for _, c := range []struct{ size, block, span int64 }{
		{0, 0, 0}, {1, 4096, 4096}, {4096, 4096, 4096}, {4097, 8192, 8192}, {3 * 4096, 3 * 4096, 4 * 4096}, {5*4096 + 1, 6 * 4096, 8 * 4096},
	} {
		if got := buffers.BlockBytes(c.size, 4096); got != c.block {
			t.Errorf("BlockBytes(%d) = %d, want %d", c.size, got, c.block)
		}
		if got := buffers.SpanBytes(c.size, 4096); got != c.span {
			t.Errorf("SpanBytes(%d) = %d, want %d", c.size, got, c.span)
		}
	}
}

// A buffer from a reserved region costs no allocation beyond the Buffer
// itself: naming the region is for errors only.
func TestReservedAcquireAllocations(t *testing.T) {
	var res [buffers.NumPurposes]int64
	res[buffers.PurposeOptimizer] = 64 << 10
	p, err := buffers.NewPool(buffers.Options{CapacityBytes: 128 << 10, Reservations: res, Pin: buffers.PinOff})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	cycle := func() {
		b, ok := p.TryAcquire(4096, buffers.PurposeOptimizer)
		if !ok {
			t.Fatal("TryAcquire failed on an empty reservation")
		}
		b.Release()
	}
	cycle()
	if a := testing.AllocsPerRun(50, cycle); a > 1 {
		t.Errorf("%.1f allocations per TryAcquire+Release from a reservation, want at most 1 (the Buffer)", a)
	}
}

// The stall error says who holds what in every region, and "nothing held"
// for a region that holds nothing: never an empty "held: ;" (a pool whose
// reservations take the whole capacity has no shared region to list).
func TestStallErrorNamesEveryRegion(t *testing.T) {
	var res [buffers.NumPurposes]int64
	res[buffers.PurposeOptimizer] = 64 << 10
	res[buffers.PurposeGradients] = 64 << 10
	p, err := buffers.NewPool(buffers.Options{CapacityBytes: 128 << 10, Reservations: res, Pin: buffers.PinOff, StallTimeout: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if got := p.Holders(); strings.HasPrefix(got, ";") || !strings.Contains(got, "optimizer region 64 KiB (65536 bytes): nothing held") {
		t.Errorf("Holders of an idle pool = %q, want every region named with \"nothing held\"", got)
	}
	held, err := p.Acquire(t.Context(), 48<<10, buffers.PurposeOptimizer)
	if err != nil {
		t.Fatal(err)
	}
	defer held.Release()
	_, err = p.Acquire(t.Context(), 32<<10, buffers.PurposeOptimizer)
	var se *buffers.StallError
	if !errors.As(err, &se) {
		t.Fatalf("got %v, want a *StallError", err)
	}
	for _, want := range []string{
		"held: optimizer region 64 KiB (65536 bytes): 48 KiB (49152 bytes) in 1 buffer(s) (optimizer 48 KiB (49152 bytes) in 1), 1 waiting: 32 KiB (32768 bytes) for optimizer",
		"; gradients region 64 KiB (65536 bytes): nothing held",
	} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("stall error %q does not say %q", err, want)
		}
	}
	if strings.Contains(err.Error(), "held: ;") {
		t.Errorf("stall error %q has an empty holder list", err)
	}
}

// TestStallNamesFragmentation: a region with the bytes a waiter needs but
// no free aligned block for it (small buffers scattered over it, see
// SpanBytes) says so in what the stall error reports, so that a stall is
// not read as a region too small.
func TestStallNamesFragmentation(t *testing.T) {
	p, err := buffers.NewPool(buffers.Options{CapacityBytes: 256 << 10, Pin: buffers.PinOff, StallTimeout: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	acq := func(n int) *buffers.Buffer {
		t.Helper()
		b, err := p.Acquire(ctx, n, buffers.PurposeParams)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	// Two 124 KiB buffers fill the halves but their last granule; two
	// 4 KiB ones take those granules, one in each half.
	a, b := acq(124<<10), acq(124<<10)
	s1, s2 := acq(4<<10), acq(4<<10)
	a.Release()
	b.Release()
	_, err = p.Acquire(ctx, 88<<10, buffers.PurposeParams)
	if !errors.Is(err, buffers.ErrStalled) {
		t.Fatalf("88 KiB with 248 KiB free but no aligned 128 KiB block: %v, want ErrStalled", err)
	}
	if !strings.Contains(err.Error(), "fragmented: 248 KiB (253952 bytes) free but no free aligned 128 KiB (131072 bytes) block") {
		t.Fatalf("the stall error does not name the fragmentation: %v", err)
	}
	s1.Release()
	got := acq(88 << 10) // one half is whole again
	got.Release()
	s2.Release()
}

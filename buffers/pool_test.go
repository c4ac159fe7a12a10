package buffers

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"strings"
	"testing"
	"time"
	"unsafe"
)

func TestOptionsDefaultsAndValidate(t *testing.T) {
	var o Options
	if err := o.Validate(); err != nil {
		t.Fatalf("zero Options must be valid (zero means default): %v", err)
	}
	o.EnsureDefaults()
	if o.CapacityBytes != 256<<20 || o.MinBufferBytes < 4096 || o.Pin != PinAuto || o.Logger == nil {
		t.Fatalf("defaults: %+v", o)
	}

	bad := Options{CapacityBytes: -1, MinBufferBytes: 3000, Pin: PinPolicy(7)}
	err := bad.Validate()
	if err == nil {
		t.Fatal("invalid options accepted")
	}
	msg := err.Error()
	for _, want := range []string{"CapacityBytes = -1", "MinBufferBytes = 3000", "power of two", "Pin = 7", "PinRequired"} {
		if !strings.Contains(msg, want) {
			t.Errorf("error %q does not mention %q", msg, want)
		}
	}
	if n := len(strings.Split(msg, "\n")); n != 3 {
		t.Errorf("want 3 problems reported at once, got %d: %q", n, msg)
	}
	if _, err := NewPool(bad); err == nil {
		t.Fatal("NewPool accepted invalid options")
	}

	huge := Options{CapacityBytes: 1 << 50, MinBufferBytes: 4096}
	if err := huge.Validate(); err == nil || !strings.Contains(err.Error(), "raise MinBufferBytes") {
		t.Fatalf("2^38 granules should be refused with advice: %v", err)
	}
	tooBig := MaxMinBufferBytes
	tooBig *= 2 // a variable: the constant would not fit a 32-bit int
	if err := (&Options{MinBufferBytes: tooBig}).Validate(); err == nil {
		t.Fatal("MinBufferBytes above the maximum accepted")
	}
}

func TestParsePinPolicy(t *testing.T) {
	for _, p := range []PinPolicy{PinAuto, PinRequired, PinOff} {
		got, err := ParsePinPolicy(p.String())
		if err != nil || got != p {
			t.Errorf("ParsePinPolicy(%q) = %v, %v", p.String(), got, err)
		}
	}
	if _, err := ParsePinPolicy("sometimes"); err == nil {
		t.Error("bad policy accepted")
	}
}

func TestPurposeString(t *testing.T) {
	want := []string{"params", "optimizer", "gradients", "staging", "checkpoint", "collectives"}
	for i, w := range want {
		if got := Purpose(i).String(); got != w {
			t.Errorf("Purpose(%d) = %q, want %q", i, got, w)
		}
	}
	if got := NumPurposes.String(); got != "purpose(6)" {
		t.Errorf("invalid purpose prints %q", got)
	}
}

func TestCapacityRounding(t *testing.T) {
	p, err := NewPool(Options{CapacityBytes: 10000, MinBufferBytes: 4096, Pin: PinOff, Logger: discardLogger()})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if p.CapacityBytes() != 12288 || p.MaxBufferBytes() != 8192 {
		t.Fatalf("capacity %d max buffer %d, want 12288 and 8192", p.CapacityBytes(), p.MaxBufferBytes())
	}
	r := p.Regions()
	if len(r) != 1 || len(r[0]) != 12288 || uintptr(unsafe.Pointer(&r[0][0]))%uintptr(os.Getpagesize()) != 0 {
		t.Fatalf("regions: %d regions", len(r))
	}
}

func TestAcquireAccountingPerPurpose(t *testing.T) {
	p := newTestPool(t, 64)
	a := mustAcquire(t, p, 1, PurposeParams)
	b := mustAcquire(t, p, 5000, PurposeParams)
	c := mustAcquire(t, p, 3*4096, PurposeOptimizer)
	d := mustAcquire(t, p, 100, PurposeCheckpoint)

	if a.Len() != 1 || a.Cap() != 4096 || b.Len() != 5000 || b.Cap() != 8192 || c.Cap() != 3*4096 {
		t.Fatalf("len/cap: %d/%d %d/%d %d/%d", a.Len(), a.Cap(), b.Len(), b.Cap(), c.Len(), c.Cap())
	}
	s := p.Stats()
	if s.InUseBytesByPurpose[PurposeParams] != 3*4096 || s.InUseBytesByPurpose[PurposeOptimizer] != 3*4096 ||
		s.InUseBytesByPurpose[PurposeCheckpoint] != 4096 || s.InUseBytesByPurpose[PurposeGradients] != 0 {
		t.Fatalf("per purpose: %v", s.InUseBytesByPurpose)
	}
	if s.InUseBytes != 7*4096 || s.RequestedBytes != 1+5000+3*4096+100 || s.Outstanding != 4 ||
		s.OutstandingByPurpose[PurposeParams] != 2 || s.Acquires != 4 || s.Waits != 0 ||
		s.FreeBytes != 57*4096 || s.CapacityBytes != 64*4096 || s.Pinned {
		t.Fatalf("stats: %+v", s)
	}
	b.Release()
	c.Release()
	s = p.Stats()
	if s.InUseBytes != 2*4096 || s.InUseBytesByPurpose[PurposeOptimizer] != 0 || s.PeakInUseBytes != 7*4096 || s.Outstanding != 2 {
		t.Fatalf("after release: %+v", s)
	}
	a.Release()
	d.Release()
	s = p.Stats()
	if s.InUseBytes != 0 || s.Outstanding != 0 || s.LargestFreeBytes != 64*4096 || s.RequestedBytes != 0 {
		t.Fatalf("after releasing all: %+v", s)
	}
}

func TestBufferAlignmentAndViews(t *testing.T) {
	p := newTestPool(t, 16)
	b := mustAcquire(t, p, 4097, PurposeStaging)
	defer b.Release()
	data := b.Bytes()
	if uintptr(unsafe.Pointer(&data[0]))%uintptr(os.Getpagesize()) != 0 {
		t.Fatal("buffer not page aligned")
	}
	if len(data) != 4097 || cap(data) != 8192 || len(b.Full()) != 8192 || len(b.Uint8()) != 4097 {
		t.Fatalf("len %d cap %d full %d", len(data), cap(data), len(b.Full()))
	}
	f := b.Float32()
	if len(f) != 1024 || cap(f) != 2048 {
		t.Fatalf("float32 view len %d cap %d", len(f), cap(f))
	}
	f[1] = 1.5
	if got := Float32Bytes(data[4:8])[0]; got != 1.5 {
		t.Fatalf("views do not share memory: %v", got)
	}
	if len(b.BFloat16()) != 2048 || len(b.Float16()) != 2048 || len(BFloat16Bytes(data)) != 2048 || len(Float16Bytes(data[2:])) != 2047 {
		t.Fatal("16-bit view lengths")
	}
	if &AsBytes(f)[4] != &data[4] || len(AsBytes(f)) != 4096 {
		t.Fatal("AsBytes does not alias the buffer")
	}
	if View[float32](data[1:9]) != nil {
		t.Fatal("misaligned view should be nil")
	}
	if View[float32](data[:3]) == nil || len(View[float32](data[:3])) != 0 {
		t.Fatal("short view should be empty (capacity remains)")
	}
	if View[float32](nil) != nil || AsBytes[float32](nil) != nil {
		t.Fatal("nil views")
	}
}

func TestAcquireInvalidAndOversize(t *testing.T) {
	p := newTestPool(t, 6) // 24 KiB, largest buffer 16 KiB
	ctx := context.Background()
	cases := []struct {
		size    int
		purpose Purpose
		want    error
	}{
		{0, PurposeParams, ErrInvalidSize},
		{-5, PurposeParams, ErrInvalidSize},
		{6*4096 + 1, PurposeParams, ErrTooLarge},
		{5 * 4096, PurposeGradients, ErrTooLarge}, // fits the budget, not one buddy block
		{1, NumPurposes, ErrInvalidPurpose},
	}
	for _, c := range cases {
		b, err := p.Acquire(ctx, c.size, c.purpose)
		var ae *AcquireError
		if b != nil || !errors.Is(err, c.want) || !errors.As(err, &ae) || ae.Size != c.size {
			t.Errorf("Acquire(%d, %v) = %v, %v; want %v", c.size, c.purpose, b, err, c.want)
		}
		if _, ok := p.TryAcquire(c.size, c.purpose); ok {
			t.Errorf("TryAcquire(%d) succeeded", c.size)
		}
	}
	_, err := p.Acquire(ctx, 1<<20, PurposeStaging)
	if msg := err.Error(); !strings.Contains(msg, "1048576 bytes for staging") || !strings.Contains(msg, "capacity") {
		t.Errorf("oversize error should name size, purpose and capacity: %q", msg)
	}
	_, err = p.Acquire(ctx, 5*4096, PurposeGradients)
	if !strings.Contains(err.Error(), "power-of-two") {
		t.Errorf("buddy limit error should explain itself: %q", err)
	}
	if b := mustAcquire(t, p, 4*4096, PurposeParams); b.Cap() != 4*4096 {
		t.Fatal("max buffer")
	} else {
		b.Release()
	}
}

func TestTryAcquire(t *testing.T) {
	p := newTestPool(t, 4)
	a, ok := p.TryAcquire(3*4096, PurposeParams)
	if !ok {
		t.Fatal("TryAcquire on an empty pool failed")
	}
	if _, ok := p.TryAcquire(2*4096, PurposeParams); ok {
		t.Fatal("TryAcquire beyond the budget succeeded")
	}
	b, ok := p.TryAcquire(4096, PurposeParams)
	if !ok {
		t.Fatal("TryAcquire of the last granule failed")
	}
	// A queued waiter keeps its turn: TryAcquire must not jump ahead even
	// when its own request would fit.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ch := acquireAsync(ctx, p, 2*4096, PurposeParams)
	waiting(t, p, 1)
	b.Release()
	if _, ok := p.TryAcquire(4096, PurposeParams); ok {
		t.Fatal("TryAcquire jumped the queue")
	}
	a.Release()
	got := receive(t, ch)
	if got.err != nil {
		t.Fatal(got.err)
	}
	got.b.Release()
	if s := p.Stats(); s.Acquires != 3 || s.Waits != 1 || s.Outstanding != 0 {
		t.Fatalf("stats %+v", s)
	}
}

func TestAcquireBlocksUntilRelease(t *testing.T) {
	p := newTestPool(t, 8)
	held := mustAcquire(t, p, 6*4096, PurposeOptimizer)
	ch := acquireAsync(context.Background(), p, 4*4096, PurposeGradients)
	waiting(t, p, 1)
	expectBlocked(t, ch)
	held.Release()
	got := receive(t, ch)
	if got.err != nil || got.b.Len() != 4*4096 || got.b.Purpose() != PurposeGradients {
		t.Fatalf("woken Acquire: %v, %v", got.b, got.err)
	}
	got.b.Release()
	if s := p.Stats(); s.Waits != 1 || s.Waiting != 0 || s.Outstanding != 0 {
		t.Fatalf("stats %+v", s)
	}
}

func TestAcquireContextCancelAndDeadline(t *testing.T) {
	p := newTestPool(t, 4)
	held := mustAcquire(t, p, 4*4096, PurposeParams)
	defer held.Release()

	ctx, cancel := context.WithCancel(context.Background())
	ch := acquireAsync(ctx, p, 4096, PurposeStaging)
	waiting(t, p, 1)
	cancel()
	got := receive(t, ch)
	if !errors.Is(got.err, context.Canceled) || got.b != nil {
		t.Fatalf("cancelled Acquire: %v, %v", got.b, got.err)
	}
	if msg := got.err.Error(); !strings.Contains(msg, "4096 bytes for staging") {
		t.Errorf("error %q should name size and purpose", msg)
	}

	dctx, dcancel := context.WithTimeout(context.Background(), 5e6)
	defer dcancel()
	if _, err := p.Acquire(dctx, 4096, PurposeParams); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("deadline: %v", err)
	}
	// A context already done fails at once, even if memory were free.
	if _, err := p.Acquire(ctx, 4096, PurposeParams); !errors.Is(err, context.Canceled) {
		t.Fatalf("done ctx: %v", err)
	}
	if s := p.Stats(); s.Waiting != 0 || s.Outstanding != 1 {
		t.Fatalf("stats after cancellations %+v", s)
	}
}

// TestCancelledHeadLetsNextWaiterIn: strict FIFO holds a small request
// behind a large one; when the large one gives up, the small one is served
// from memory that was already free.
func TestCancelledHeadLetsNextWaiterIn(t *testing.T) {
	p := newTestPool(t, 8)
	a := mustAcquire(t, p, 4*4096, PurposeParams)
	b := mustAcquire(t, p, 4*4096, PurposeParams)
	bigCtx, cancelBig := context.WithCancel(context.Background())
	big := acquireAsync(bigCtx, p, 8*4096, PurposeOptimizer)
	waiting(t, p, 1)
	small := acquireAsync(context.Background(), p, 4096, PurposeStaging)
	waiting(t, p, 2)
	a.Release() // enough for small, but big is first in line
	expectBlocked(t, small)
	cancelBig()
	if got := receive(t, big); !errors.Is(got.err, context.Canceled) {
		t.Fatalf("big: %v", got.err)
	}
	got := receive(t, small)
	if got.err != nil {
		t.Fatal(got.err)
	}
	got.b.Release()
	b.Release()
}

// TestFragmentationIsNotPermanent: free memory split into single granules
// cannot serve a two-granule request, which waits, and is served once the
// neighbours are released and merge.
func TestFragmentationIsNotPermanent(t *testing.T) {
	p := newTestPool(t, 8)
	var bufs []*Buffer
	for range 8 {
		bufs = append(bufs, mustAcquire(t, p, 4096, PurposeGradients))
	}
	for i := 0; i < 8; i += 2 {
		bufs[i].Release()
	}
	if s := p.Stats(); s.FreeBytes != 4*4096 || s.LargestFreeBytes != 4096 {
		t.Fatalf("fragmented stats %+v", s)
	}
	ch := acquireAsync(context.Background(), p, 2*4096, PurposeParams)
	waiting(t, p, 1)
	expectBlocked(t, ch)
	bufs[5].Release()
	got := receive(t, ch)
	if got.err != nil {
		t.Fatal(got.err)
	}
	got.b.Release()
	for _, i := range []int{1, 3, 7} {
		bufs[i].Release()
	}
	if s := p.Stats(); s.LargestFreeBytes != 8*4096 {
		t.Fatalf("arena did not merge back whole: %+v", s)
	}
}

// TestLargeWaiterNotStarved: while a whole-arena request waits, new small
// requests queue behind it instead of keeping the arena busy forever.
func TestLargeWaiterNotStarved(t *testing.T) {
	p := newTestPool(t, 4)
	held := mustAcquire(t, p, 4096, PurposeParams)
	big := acquireAsync(context.Background(), p, 4*4096, PurposeParams)
	waiting(t, p, 1)
	smallCh := acquireAsync(context.Background(), p, 4096, PurposeParams)
	waiting(t, p, 2)
	held.Release()
	got := receive(t, big)
	if got.err != nil {
		t.Fatal(got.err)
	}
	expectBlocked(t, smallCh)
	got.b.Release()
	s := receive(t, smallCh)
	if s.err != nil {
		t.Fatal(s.err)
	}
	s.b.Release()
}

func TestRetainKeepsMemory(t *testing.T) {
	p := newTestPool(t, 1)
	b := mustAcquire(t, p, 10, PurposeStaging)
	b.Retain() // an in-flight I/O
	b.Release()
	if p.Stats().Outstanding != 1 || b.Bytes() == nil {
		t.Fatal("memory returned while still retained")
	}
	if _, ok := p.TryAcquire(1, PurposeParams); ok {
		t.Fatal("retained memory handed out again")
	}
	b.Release()
	if p.Stats().Outstanding != 0 || b.Bytes() != nil || b.Full() != nil || b.Float32() != nil {
		t.Fatal("final release did not return the memory or views still work")
	}
}

func TestOverReleaseIsLoggedNotCorrupting(t *testing.T) {
	rec := &recorder{}
	p, err := NewPool(Options{CapacityBytes: 2 * 4096, MinBufferBytes: 4096, Pin: PinOff, Logger: slog.New(rec)})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	b := mustAcquire(t, p, 4096, PurposeParams)
	b.Release()
	other := mustAcquire(t, p, 2*4096, PurposeOptimizer) // may reuse b's memory
	b.Release()                                          // bug: must not free other's memory
	b.Retain()                                           // bug: must not resurrect b
	if s := p.Stats(); s.Misuses != 2 || s.Outstanding != 1 || s.InUseBytes != 2*4096 {
		t.Fatalf("misuse corrupted the pool: %+v", s)
	}
	if _, ok := p.TryAcquire(4096, PurposeParams); ok {
		t.Fatal("over-release freed someone else's memory")
	}
	errs := rec.at(slog.LevelError)
	if len(errs) != 2 || !strings.Contains(errs[0], "more times than Retain") || !strings.Contains(errs[1], "Retain after") {
		t.Fatalf("misuse logs: %q", errs)
	}
	other.Release()
}

func TestCloseReportsLeaksAndKeepsMemoryMapped(t *testing.T) {
	p, err := NewPool(Options{CapacityBytes: 16 * 4096, MinBufferBytes: 4096, Pin: PinOff, Logger: discardLogger()})
	if err != nil {
		t.Fatal(err)
	}
	a := mustAcquire(t, p, 4096, PurposeParams)
	b := mustAcquire(t, p, 2*4096, PurposeParams)
	c := mustAcquire(t, p, 100, PurposeStaging)
	err = p.Close()
	if !errors.Is(err, ErrOutstanding) {
		t.Fatalf("Close with leaks: %v", err)
	}
	for _, want := range []string{"3 buffer(s)", "params: 2", "staging: 1"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("leak report %q lacks %q", err, want)
		}
	}
	// The leaked memory must still be usable (a late I/O completion).
	a.Bytes()[0] = 1
	b.Full()[8191] = 2
	if p.Regions() == nil {
		t.Fatal("arena unmapped while buffers are outstanding")
	}
	if _, err := p.Acquire(context.Background(), 4096, PurposeParams); !errors.Is(err, ErrClosed) {
		t.Fatalf("Acquire after Close: %v", err)
	}
	if _, ok := p.TryAcquire(4096, PurposeParams); ok {
		t.Fatal("TryAcquire after Close")
	}
	if err := p.Close(); !errors.Is(err, ErrClosed) {
		t.Fatalf("second Close: %v", err)
	}
	a.Release()
	b.Release()
	if p.Regions() == nil {
		t.Fatal("unmapped before the last leaked buffer came back")
	}
	c.Release()
	if p.Regions() != nil || p.Stats().Outstanding != 0 {
		t.Fatal("arena not unmapped after the last leaked buffer was released")
	}
}

func TestCloseWakesWaiters(t *testing.T) {
	p, err := NewPool(Options{CapacityBytes: 4096, MinBufferBytes: 4096, Pin: PinOff, Logger: discardLogger()})
	if err != nil {
		t.Fatal(err)
	}
	held := mustAcquire(t, p, 4096, PurposeParams)
	ch1 := acquireAsync(context.Background(), p, 4096, PurposeGradients)
	ch2 := acquireAsync(context.Background(), p, 4096, PurposeStaging)
	waiting(t, p, 2)
	if err := p.Close(); !errors.Is(err, ErrOutstanding) {
		t.Fatalf("Close: %v", err)
	}
	for _, ch := range []<-chan acquired{ch1, ch2} {
		if got := receive(t, ch); !errors.Is(got.err, ErrClosed) {
			t.Fatalf("waiter after Close: %v", got.err)
		}
	}
	held.Release()
	if p.Regions() != nil {
		t.Fatal("arena still mapped")
	}
}

func TestCloseCleanUnmaps(t *testing.T) {
	p, err := NewPool(Options{CapacityBytes: 4096, Pin: PinOff, Logger: discardLogger()})
	if err != nil {
		t.Fatal(err)
	}
	mustAcquire(t, p, 1, PurposeParams).Release()
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if p.Regions() != nil {
		t.Fatal("Regions after Close")
	}
}

// TestGrantRacingCancel forces the window where a waiter's context is done
// and, before it can dequeue itself, a release grants it memory: the buffer
// must go straight back to the pool and the books must balance.
func TestGrantRacingCancel(t *testing.T) {
	p := newTestPool(t, 2)
	held := mustAcquire(t, p, 2*4096, PurposeParams)
	ctx, cancel := context.WithCancel(context.Background())
	ch := acquireAsync(ctx, p, 4096, PurposeStaging)
	waiting(t, p, 1)

	p.mu.Lock()
	cancel()
	time.Sleep(50 * time.Millisecond) // let the waiter see ctx.Done and block on mu
	held.refs.Store(0)                // what the final Release does before put
	p.putLocked(held)                 // grants the waiter under our lock
	p.mu.Unlock()

	got := receive(t, ch)
	switch {
	case errors.Is(got.err, context.Canceled):
		t.Log("granted after cancel: handed back")
	case got.err == nil:
		t.Log("the waiter saw the grant first")
		got.b.Release()
	default:
		t.Fatal(got.err)
	}
	if s := p.Stats(); s.Outstanding != 0 || s.InUseBytes != 0 || s.Waiting != 0 {
		t.Fatalf("books after a grant raced a cancel: %+v", s)
	}
	mustAcquire(t, p, 2*4096, PurposeParams).Release()
}

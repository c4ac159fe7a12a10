package accel_test

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/zinfio/zinf/accel"
)

func newSim(t *testing.T, opts accel.SimOptions) *accel.Sim {
	t.Helper()
	s, err := accel.NewSim(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func TestSimDefaults(t *testing.T) {
	s := newSim(t, accel.SimOptions{})
	if s.Name() != "sim" || s.CapacityBytes() != 1<<30 || s.UsedBytes() != 0 {
		t.Fatalf("defaults: name %q capacity %d used %d", s.Name(), s.CapacityBytes(), s.UsedBytes())
	}
	if _, err := accel.NewSim(accel.SimOptions{CapacityBytes: -1}); !errors.Is(err, accel.ErrInvalid) {
		t.Fatalf("negative capacity: %v", err)
	}
}

func TestSimRoundTrip(t *testing.T) {
	s := newSim(t, accel.SimOptions{CapacityBytes: 256 << 20})
	st, err := s.NewStream()
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	rng := rand.NewChaCha8([32]byte{1, 2})
	for _, size := range []int{1, 4095, 4096, 4097, 1 << 20, 3<<20 + 17, 64 << 20} {
		m, err := s.Alloc(int64(size) + 100)
		if err != nil {
			t.Fatal(err)
		}
		src := make([]byte, size)
		rng.Read(src)
		if err := s.CopyToDevice(st, m, 100, src); err != nil {
			t.Fatal(err)
		}
		// Same stream: the read-back runs after the write.
		dst := make([]byte, size)
		if err := s.CopyFromDevice(st, dst, m, 100); err != nil {
			t.Fatal(err)
		}
		if err := st.Synchronize(); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(src, dst) {
			t.Fatalf("size %d: bytes differ after round trip", size)
		}
		view, err := s.HostView(m)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(view[100:], src) || !bytes.Equal(view[:100], make([]byte, 100)) {
			t.Fatalf("size %d: device bytes wrong", size)
		}
		if err := s.Free(m); err != nil {
			t.Fatal(err)
		}
	}
	if s.UsedBytes() != 0 {
		t.Fatalf("used %d after freeing everything", s.UsedBytes())
	}
}

func TestSimOutOfMemory(t *testing.T) {
	s := newSim(t, accel.SimOptions{CapacityBytes: 1 << 20})
	a, err := s.Alloc(768 << 10)
	if err != nil {
		t.Fatal(err)
	}
	_, err = s.Alloc(512 << 10)
	if !errors.Is(err, accel.ErrOutOfMemory) {
		t.Fatalf("over capacity: got %v, want ErrOutOfMemory", err)
	}
	for _, want := range []string{"requested 524288 bytes", "786432 of 1048576 in use"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
	if s.UsedBytes() != 768<<10 {
		t.Fatalf("failed alloc changed used bytes: %d", s.UsedBytes())
	}
	if err := s.Free(a); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Alloc(1 << 20); err != nil {
		t.Fatalf("full-capacity alloc after free: %v", err)
	}
	for _, size := range []int64{0, -5} {
		if _, err := s.Alloc(size); !errors.Is(err, accel.ErrInvalid) {
			t.Errorf("Alloc(%d): %v, want ErrInvalid", size, err)
		}
	}
}

func TestSimBounds(t *testing.T) {
	s := newSim(t, accel.SimOptions{})
	st, _ := s.NewStream()
	m, _ := s.Alloc(4096)
	buf := make([]byte, 100)
	cases := []struct {
		off int64
		n   int
	}{{-1, 1}, {4096, 1}, {4000, 100}, {1 << 62, 100}, {0, 4097}, {5000, 0}}
	for _, c := range cases {
		if err := s.CopyToDevice(st, m, c.off, make([]byte, c.n)); !errors.Is(err, accel.ErrBounds) {
			t.Errorf("CopyToDevice off %d n %d: %v, want ErrBounds", c.off, c.n, err)
		}
		if err := s.CopyFromDevice(st, make([]byte, c.n), m, c.off); !errors.Is(err, accel.ErrBounds) {
			t.Errorf("CopyFromDevice off %d n %d: %v, want ErrBounds", c.off, c.n, err)
		}
	}
	// Edges that are in bounds.
	if err := s.CopyToDevice(st, m, 3996, buf); err != nil {
		t.Fatal(err)
	}
	if err := s.CopyFromDevice(st, nil, m, 4096); err != nil {
		t.Fatal(err)
	}
	if err := st.Synchronize(); err != nil {
		t.Fatal(err)
	}
}

func TestSimInvalidHandles(t *testing.T) {
	s := newSim(t, accel.SimOptions{})
	other := newSim(t, accel.SimOptions{})
	m, _ := s.Alloc(4096)
	om, _ := other.Alloc(4096)
	st, _ := s.NewStream()
	ost, _ := other.NewStream()

	if err := s.Free(om); !errors.Is(err, accel.ErrInvalid) {
		t.Errorf("free of another device's memory: %v", err)
	}
	if err := s.CopyToDevice(st, om, 0, []byte{1}); !errors.Is(err, accel.ErrInvalid) {
		t.Errorf("copy into another device's memory: %v", err)
	}
	if err := s.CopyToDevice(ost, m, 0, []byte{1}); !errors.Is(err, accel.ErrInvalid) {
		t.Errorf("copy on another device's stream: %v", err)
	}
	if err := s.CopyToDevice(nil, m, 0, []byte{1}); !errors.Is(err, accel.ErrInvalid) {
		t.Errorf("copy on nil stream: %v", err)
	}
	if err := s.Free(nil); !errors.Is(err, accel.ErrInvalid) {
		t.Errorf("free nil: %v", err)
	}
	if err := s.Free(m); err != nil {
		t.Fatal(err)
	}
	err := s.Free(m)
	if !errors.Is(err, accel.ErrInvalid) || !strings.Contains(err.Error(), "already freed") {
		t.Errorf("double free: %v", err)
	}
	if err := s.CopyToDevice(st, m, 0, []byte{1}); !errors.Is(err, accel.ErrInvalid) {
		t.Errorf("copy into freed memory: %v", err)
	}
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}
	if err := st.Close(); err != nil {
		t.Errorf("second stream close: %v", err)
	}
	m2, _ := s.Alloc(10)
	if err := s.CopyToDevice(st, m2, 0, []byte{1}); !errors.Is(err, accel.ErrClosed) {
		t.Errorf("copy on closed stream: %v", err)
	}
}

func TestSimUseAfterClose(t *testing.T) {
	s := newSim(t, accel.SimOptions{})
	m, _ := s.Alloc(4096)
	st, _ := s.NewStream()
	if err := s.CopyToDevice(st, m, 0, make([]byte, 4096)); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatalf("second close: %v", err)
	}
	if s.UsedBytes() != 0 {
		t.Fatalf("used %d after close", s.UsedBytes())
	}
	checks := map[string]error{
		"alloc": func() error { _, err := s.Alloc(1); return err }(),
		"free":  s.Free(m),
		"stream": func() error {
			_, err := s.NewStream()
			return err
		}(),
		"copy to":    s.CopyToDevice(st, m, 0, []byte{1}),
		"copy from":  s.CopyFromDevice(st, []byte{1}, m, 0),
		"register":   s.RegisterHost([]byte{1}),
		"unregister": s.UnregisterHost([]byte{1}),
		"host view":  func() error { _, err := s.HostView(m); return err }(),
	}
	for name, err := range checks {
		if !errors.Is(err, accel.ErrClosed) {
			t.Errorf("%s after close: %v, want ErrClosed", name, err)
		}
	}
}

func TestSimCopyFaultSurfacesAtSynchronize(t *testing.T) {
	boom := errors.New("injected link error")
	var calls int
	var mu sync.Mutex
	s := newSim(t, accel.SimOptions{CopyFault: func(c accel.SimCopy) error {
		mu.Lock()
		defer mu.Unlock()
		calls++
		if c.ToDevice && c.Offset == 4096 {
			return boom
		}
		return nil
	}})
	m, _ := s.Alloc(8192)
	st, _ := s.NewStream()
	src := bytes.Repeat([]byte{7}, 4096)
	for _, off := range []int64{0, 4096} {
		if err := s.CopyToDevice(st, m, off, src); err != nil {
			t.Fatal(err)
		}
	}
	err := st.Synchronize()
	if !errors.Is(err, boom) || !strings.Contains(err.Error(), "offset 4096") {
		t.Fatalf("Synchronize: %v, want the injected error naming offset 4096", err)
	}
	if err := st.Synchronize(); err != nil {
		t.Fatalf("error not cleared by Synchronize: %v", err)
	}
	view, _ := s.HostView(m)
	if view[0] != 7 || view[4096] != 0 {
		t.Fatalf("failed copy moved bytes or good copy did not: %d %d", view[0], view[4096])
	}
	// Close reports an error still pending on a stream.
	if err := s.CopyToDevice(st, m, 4096, src); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); !errors.Is(err, boom) {
		t.Fatalf("Close: %v, want the pending stream error", err)
	}
}

func TestSimFreeWhileCopyQueued(t *testing.T) {
	// A slow link keeps copies queued while the memory is freed: the copy
	// still completes on valid memory and nothing crashes.
	s := newSim(t, accel.SimOptions{BandwidthBytesPerSec: 64 << 20})
	st, _ := s.NewStream()
	m, _ := s.Alloc(1 << 20)
	src := make([]byte, 1<<20)
	for range 3 {
		if err := s.CopyToDevice(st, m, 0, src); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Free(m); err != nil {
		t.Fatal(err)
	}
	if s.UsedBytes() != 0 {
		t.Fatalf("capacity not returned at Free: %d", s.UsedBytes())
	}
	if err := st.Synchronize(); err != nil {
		t.Fatal(err)
	}
}

func TestSimBandwidthModel(t *testing.T) {
	// 2 MiB at 16 MiB/s occupies the link for 125 ms; two streams share it,
	// so both copies together take at least 250 ms. Only the lower bound is
	// checked: sleeping never finishes early.
	s := newSim(t, accel.SimOptions{BandwidthBytesPerSec: 16 << 20})
	m, _ := s.Alloc(4 << 20)
	a, _ := s.NewStream()
	b, _ := s.NewStream()
	src := make([]byte, 2<<20)
	start := time.Now()
	if err := s.CopyToDevice(a, m, 0, src); err != nil {
		t.Fatal(err)
	}
	if err := s.CopyToDevice(b, m, 2<<20, src); err != nil {
		t.Fatal(err)
	}
	a.Synchronize()
	b.Synchronize()
	if el := time.Since(start); el < 240*time.Millisecond {
		t.Fatalf("two 2 MiB copies over a shared 16 MiB/s link took %v, want >= 250ms", el)
	}
}

func TestSimRegisterHostPairs(t *testing.T) {
	s := newSim(t, accel.SimOptions{})
	b := make([]byte, 8192)
	if err := s.RegisterHost(b); err != nil {
		t.Fatal(err)
	}
	if err := s.RegisterHost(b); !errors.Is(err, accel.ErrInvalid) {
		t.Fatalf("double register: %v", err)
	}
	if s.HostRegistrations() != 1 {
		t.Fatalf("registrations %d", s.HostRegistrations())
	}
	if err := s.UnregisterHost(b); err != nil {
		t.Fatal(err)
	}
	if err := s.UnregisterHost(b); !errors.Is(err, accel.ErrInvalid) {
		t.Fatalf("unregister of unregistered memory: %v", err)
	}
	if err := s.RegisterHost(nil); !errors.Is(err, accel.ErrInvalid) {
		t.Fatalf("register empty: %v", err)
	}
	if s.HostRegistrations() != 0 {
		t.Fatalf("registrations %d", s.HostRegistrations())
	}
}

// TestSimConcurrentStress runs allocations, copies, frees and synchronizes
// from many goroutines at once; run it with -race.
func TestSimConcurrentStress(t *testing.T) {
	s := newSim(t, accel.SimOptions{CapacityBytes: 8 << 20})
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(g), 99))
			st, err := s.NewStream()
			if err != nil {
				errs <- err
				return
			}
			defer st.Close()
			for i := range 200 {
				size := 1 + rng.IntN(256<<10)
				m, err := s.Alloc(int64(size))
				if errors.Is(err, accel.ErrOutOfMemory) {
					continue
				}
				if err != nil {
					errs <- err
					return
				}
				src := make([]byte, size)
				src[0], src[size-1] = byte(g), byte(i)
				dst := make([]byte, size)
				if err := s.CopyToDevice(st, m, 0, src); err != nil {
					errs <- err
					return
				}
				if err := s.CopyFromDevice(st, dst, m, 0); err != nil {
					errs <- err
					return
				}
				if i%3 == 0 { // free before synchronizing: the copies still finish
					if err := s.Free(m); err != nil {
						errs <- err
						return
					}
				}
				if err := st.Synchronize(); err != nil {
					errs <- err
					return
				}
				if !bytes.Equal(src, dst) {
					errs <- fmt.Errorf("goroutine %d op %d: bytes differ", g, i)
					return
				}
				if i%3 != 0 {
					if err := s.Free(m); err != nil {
						errs <- err
						return
					}
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if s.UsedBytes() != 0 {
		t.Fatalf("used %d after stress", s.UsedBytes())
	}
}

func TestSimCloseWhileCopying(t *testing.T) {
	s, err := accel.NewSim(accel.SimOptions{})
	if err != nil {
		t.Fatal(err)
	}
	m, _ := s.Alloc(1 << 20)
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			st, err := s.NewStream()
			if err != nil {
				return
			}
			src := make([]byte, 64<<10)
			for {
				if err := s.CopyToDevice(st, m, 0, src); err != nil {
					if !errors.Is(err, accel.ErrClosed) {
						t.Errorf("copy during close: %v", err)
					}
					return
				}
			}
		}()
	}
	time.Sleep(10 * time.Millisecond)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
}

func ExampleSim() {
	dev, err := accel.NewSim(accel.SimOptions{CapacityBytes: 1 << 20})
	if err != nil {
		panic(err)
	}
	defer dev.Close()
	m, _ := dev.Alloc(4096)
	st, _ := dev.NewStream()
	dev.CopyToDevice(st, m, 0, []byte("hello, device"))
	out := make([]byte, 13)
	dev.CopyFromDevice(st, out, m, 0)
	if err := st.Synchronize(); err != nil {
		panic(err)
	}
	fmt.Println(string(out), dev.UsedBytes())
	_, err = dev.Alloc(2 << 20)
	fmt.Println(errors.Is(err, accel.ErrOutOfMemory))
	// Output:
	// hello, device 4096
	// true
}

package gds_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"

	"github.com/zinfio/zinf/accel"
	"github.com/zinfio/zinf/aio"
	"github.com/zinfio/zinf/buffers"
	"github.com/zinfio/zinf/gds"
)

func newBounce(t *testing.T, env *bounceEnv, opts gds.BounceOptions) *gds.Bounce {
	t.Helper()
	b, err := gds.NewBounce(env.sim, env.eng, env.pool, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	return b
}

// TestBounceRoundTrip moves bytes NVMe -> device -> NVMe through the
// staging buffers for sizes from 4 KiB to 64 MiB, aligned and not, at
// unaligned file and device offsets, on an O_DIRECT file where the
// filesystem allows it, and compares them byte for byte.
func TestBounceRoundTrip(t *testing.T) {
	for _, par := range []int{1, 3} {
		t.Run(fmt.Sprintf("parallelism=%d", par), func(t *testing.T) {
			env := newBounceEnv(t, accel.SimOptions{CapacityBytes: 256 << 20}, aio.Options{})
			b := newBounce(t, env, gds.BounceOptions{BlockSizeBytes: 1 << 20, Parallelism: par})
			ctx := context.Background()
			for i, size := range shortSizes() {
				for _, offs := range [][2]int64{{0, 0}, {4096, 4096}, {4096*5 + 17, 9}} {
					fileOff, memOff := offs[0], offs[1]
					want := randomBytes(uint64(i*100+par), size)
					src := env.dir + fmt.Sprintf("/src-%d-%d", size, fileOff)
					if err := os.WriteFile(src, append(make([]byte, fileOff), want...), 0o600); err != nil {
						t.Fatal(err)
					}
					in, err := b.OpenFile(src, os.O_RDONLY, 0)
					if err != nil {
						t.Fatal(err)
					}
					m, err := env.sim.Alloc(size + memOff)
					if err != nil {
						t.Fatal(err)
					}
					if n, err := b.ReadToDevice(ctx, in, m, memOff, fileOff, size); err != nil || n != size {
						t.Fatalf("size %d: ReadToDevice = %d, %v", size, n, err)
					}
					view, _ := env.sim.HostView(m)
					sameBytes(t, fmt.Sprintf("size %d at %d: device", size, fileOff), view[memOff:memOff+size], want)

					dst := env.dir + fmt.Sprintf("/dst-%d-%d", size, fileOff)
					out, err := b.OpenFile(dst, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o600)
					if err != nil {
						t.Fatal(err)
					}
					if n, err := b.WriteFromDevice(ctx, out, m, memOff, fileOff, size); err != nil || n != size {
						t.Fatalf("size %d: WriteFromDevice = %d, %v", size, n, err)
					}
					sameBytes(t, fmt.Sprintf("size %d at %d: file", size, fileOff), fileBytes(t, dst, fileOff, size), want)
					if fileOff > 0 {
						sameBytes(t, "bytes before the range", fileBytes(t, dst, 0, fileOff), make([]byte, fileOff))
					}
					in.Close()
					out.Close()
					env.sim.Free(m)
					os.Remove(src)
					os.Remove(dst)
				}
			}
		})
	}
}

// TestBouncePreservesNeighbours writes unaligned ranges into a file full of
// a pattern and checks that every byte outside the range is unchanged: the
// read-modify-write of partial O_DIRECT blocks must not clobber them.
func TestBouncePreservesNeighbours(t *testing.T) {
	env := newBounceEnv(t, accel.SimOptions{}, aio.Options{})
	b := newBounce(t, env, gds.BounceOptions{BlockSizeBytes: 64 << 10, Parallelism: 2})
	ctx := context.Background()
	const fileSize = 1 << 20
	path := env.dir + "/f"
	ranges := [][2]int64{{1, 1}, {100, 10}, {4095, 2}, {4000, 200000}, {65535, 65538}, {fileSize - 5, 5}, {fileSize - 5, 100}, {fileSize + 3000, 777}}
	for i, r := range ranges {
		off, n := r[0], r[1]
		base := randomBytes(uint64(1000+i), fileSize)
		if err := os.WriteFile(path, base, 0o600); err != nil {
			t.Fatal(err)
		}
		f, err := b.OpenFile(path, os.O_RDWR, 0)
		if err != nil {
			t.Fatal(err)
		}
		if i == 0 {
			t.Logf("file O_DIRECT %v, alignment %d", f.Direct(), f.Alignment())
		}
		data := randomBytes(uint64(2000+i), n)
		m := upload(t, env.sim, data, 0, n)
		if _, err := b.WriteFromDevice(ctx, f, m, 0, off, n); err != nil {
			t.Fatalf("write %d bytes at %d: %v", n, off, err)
		}
		f.Close()
		got, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		want := append([]byte(nil), base...)
		if end := off + n; end > int64(len(want)) {
			want = append(want, make([]byte, end-int64(len(want)))...)
		}
		copy(want[off:], data)
		if int64(len(got)) < int64(len(want)) {
			t.Fatalf("range %v: file is %d bytes, want at least %d", r, len(got), len(want))
		}
		sameBytes(t, fmt.Sprintf("range %v", r), got[:len(want)], want)
		for _, c := range got[len(want):] { // padding past the old end is zeros
			if c != 0 {
				t.Fatalf("range %v: non-zero padding past the written range", r)
			}
		}
		env.sim.Free(m)
	}
}

func TestBounceConcurrentRequests(t *testing.T) {
	env := newBounceEnv(t, accel.SimOptions{}, aio.Options{IntraOpParallelism: 2})
	b := newBounce(t, env, gds.BounceOptions{BlockSizeBytes: 256 << 10, Parallelism: 2})
	ctx := context.Background()
	f, err := b.OpenFile(env.dir+"/f", os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	const each = 3<<20 + 4096
	var wg sync.WaitGroup
	for g := range 6 {
		want := randomBytes(uint64(g), each)
		m := upload(t, env.sim, want, 0, each)
		back, err := env.sim.Alloc(each)
		if err != nil {
			t.Fatal(err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			off := int64(g) * 4 << 20
			if _, err := b.WriteFromDevice(ctx, f, m, 0, off, each); err != nil {
				t.Error(err)
				return
			}
			if _, err := b.ReadToDevice(ctx, f, back, 0, off, each); err != nil {
				t.Error(err)
				return
			}
			view, _ := env.sim.HostView(back)
			if string(view) != string(want) {
				t.Errorf("goroutine %d: bytes differ", g)
			}
		}()
	}
	wg.Wait()
	st := b.Stats()
	if st.ReadOps != 6 || st.WriteOps != 6 || st.ReadBytes != 6*each {
		t.Errorf("stats %+v", st)
	}
}

// faultHook fails aio pieces whose file range contains at with errno.
type faultHook struct {
	at    atomic.Int64
	errno syscall.Errno
	op    aio.Op
}

func (h *faultHook) Before(p aio.PieceInfo) aio.Fault {
	at := h.at.Load()
	if p.Op == h.op && at >= p.Offset && at < p.Offset+int64(p.Len) {
		return aio.Fault{Err: h.errno}
	}
	return aio.Fault{}
}

func TestBounceErrors(t *testing.T) {
	hook := &faultHook{errno: syscall.ENOSPC, op: aio.OpWrite}
	hook.at.Store(-1)
	boom := errors.New("injected PCIe error")
	var failCopies atomic.Bool
	env := newBounceEnv(t, accel.SimOptions{CopyFault: func(c accel.SimCopy) error {
		if failCopies.Load() {
			return boom
		}
		return nil
	}}, aio.Options{Faults: hook})
	b := newBounce(t, env, gds.BounceOptions{BlockSizeBytes: 1 << 20})
	ctx := context.Background()
	path := env.dir + "/f"
	f, err := b.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	m := upload(t, env.sim, randomBytes(5, 4<<20), 0, 4<<20)

	t.Run("ENOSPC", func(t *testing.T) {
		hook.at.Store(2<<20 + 5)
		defer hook.at.Store(-1)
		n, err := b.WriteFromDevice(ctx, f, m, 0, 0, 4<<20)
		wantErr(t, err, aio.ErrNoSpace, "write", path, "backend bounce", "piece at file offset 2097152", "2097152 done")
		if n != 2<<20 {
			t.Errorf("bytes done %d, want 2 MiB", n)
		}
	})
	t.Run("device copy fails", func(t *testing.T) {
		failCopies.Store(true)
		defer failCopies.Store(false)
		_, err := b.ReadToDevice(ctx, f, m, 0, 0, 1<<20)
		wantErr(t, err, boom, "read", "injected PCIe error")
		_, err = b.WriteFromDevice(ctx, f, m, 0, 0, 1<<20)
		wantErr(t, err, boom, "write")
	})
	t.Run("read past end of file", func(t *testing.T) {
		if err := f.Truncate(10000); err != nil {
			t.Fatal(err)
		}
		n, err := b.ReadToDevice(ctx, f, m, 0, 0, 20000)
		wantErr(t, err, aio.ErrShortTransfer, "end of file")
		if n != 0 {
			t.Errorf("bytes done %d", n)
		}
		// The bytes that exist read fine, even when the aligned span
		// reaches past the end.
		if n, err := b.ReadToDevice(ctx, f, m, 0, 9000, 1000); err != nil || n != 1000 {
			t.Errorf("read up to the end: %d, %v", n, err)
		}
	})
	t.Run("bounds and arguments", func(t *testing.T) {
		_, err := b.ReadToDevice(ctx, f, m, 1, 0, 4<<20)
		wantErr(t, err, accel.ErrBounds)
		_, err = b.ReadToDevice(ctx, f, nil, 0, 0, 1)
		wantErr(t, err, accel.ErrInvalid)
		_, err = b.ReadToDevice(ctx, nil, m, 0, 0, 1)
		wantErr(t, err, nil, "nil file")
	})
	t.Run("canceled", func(t *testing.T) {
		cctx, cancel := context.WithCancel(ctx)
		cancel()
		_, err := b.WriteFromDevice(cctx, f, m, 0, 0, 4<<20)
		wantErr(t, err, context.Canceled)
	})
	t.Run("zero bytes", func(t *testing.T) {
		if n, err := b.WriteFromDevice(ctx, f, m, 0, 0, 0); n != 0 || err != nil {
			t.Errorf("empty write: %d, %v", n, err)
		}
	})
}

func TestBounceReleasesEverything(t *testing.T) {
	env := newBounceEnv(t, accel.SimOptions{}, aio.Options{})
	b, err := gds.NewBounce(env.sim, env.eng, env.pool, gds.BounceOptions{BlockSizeBytes: 1 << 20, Parallelism: 4})
	if err != nil {
		t.Fatal(err)
	}
	if st := env.pool.Stats(); st.OutstandingByPurpose[buffers.PurposeStaging] != 8 {
		t.Fatalf("staging buffers held: %d, want 8", st.OutstandingByPurpose[buffers.PurposeStaging])
	}
	if n := env.sim.HostRegistrations(); n != 8 {
		t.Fatalf("%d staging buffers registered with the device, want 8", n)
	}
	f, err := b.OpenFile(env.dir+"/f", os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	if st := env.pool.Stats(); st.Outstanding != 0 {
		t.Fatalf("%d buffers still out after Close", st.Outstanding)
	}
	if n := env.sim.HostRegistrations(); n != 0 {
		t.Fatalf("%d registrations left after Close", n)
	}
	m, _ := env.sim.Alloc(4096)
	_, err = b.ReadToDevice(context.Background(), f, m, 0, 0, 4096)
	wantErr(t, err, aio.ErrClosed)
	if err := b.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
}

func TestNewBounceErrors(t *testing.T) {
	env := newBounceEnv(t, accel.SimOptions{}, aio.Options{})
	_, err := gds.NewBounce(env.sim, env.eng, env.pool, gds.BounceOptions{BlockSizeBytes: 16 << 20, Parallelism: 4})
	wantErr(t, err, nil, "cannot supply 8 staging buffers of 16777216 bytes")
	if st := env.pool.Stats(); st.Outstanding != 0 {
		t.Fatalf("failed NewBounce kept %d buffers", st.Outstanding)
	}
	if n := env.sim.HostRegistrations(); n != 0 {
		t.Fatalf("failed NewBounce left %d registrations", n)
	}
	_, err = gds.NewBounce(env.sim, env.eng, env.pool, gds.BounceOptions{BlockSizeBytes: 1000, Parallelism: 100})
	wantErr(t, err, nil, "block size 1000", "parallelism 100")
	_, err = gds.NewBounce(nil, env.eng, env.pool, gds.BounceOptions{})
	wantErr(t, err, accel.ErrInvalid)
}

func TestBounceCloseAfterDevice(t *testing.T) {
	env := newBounceEnv(t, accel.SimOptions{}, aio.Options{})
	b, err := gds.NewBounce(env.sim, env.eng, env.pool, gds.BounceOptions{Parallelism: 2})
	if err != nil {
		t.Fatal(err)
	}
	if err := env.sim.Close(); err != nil {
		t.Fatal(err)
	}
	if err := b.Close(); err != nil {
		t.Fatalf("Close after the device closed: %v", err)
	}
	if st := env.pool.Stats(); st.Outstanding != 0 {
		t.Fatalf("%d buffers still out", st.Outstanding)
	}
}

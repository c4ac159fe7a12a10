package gds_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/zinfio/zinf/accel"
	"github.com/zinfio/zinf/accel/cuda"
	"github.com/zinfio/zinf/aio"
	"github.com/zinfio/zinf/gds"
	"github.com/zinfio/zinf/internal/test/cudatest"
)

func openEngine(t *testing.T, s *standins, opts gds.Options) *gds.Engine {
	t.Helper()
	opts.Library = s.cufileLib
	e, err := gds.Open(s.dev, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	return e
}

// TestEngineRoundTrip writes device memory to a file and reads it back
// with cuFile, for sizes from 4 KiB to 64 MiB, aligned and not, at
// unaligned file and device offsets, checking the file's bytes, the
// device's bytes, and that no transfer exceeded the block size.
func TestEngineRoundTrip(t *testing.T) {
	s := newStandins(t)
	const block = 1 << 20
	e := openEngine(t, s, gds.Options{BlockSizeBytes: block, Parallelism: 4})
	ctx := context.Background()
	path := tempPath(t, "swap")
	f, err := e.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for i, size := range shortSizes() {
		for _, offs := range [][2]int64{{0, 0}, {4096 * 3, 0}, {13, 7}} {
			fileOff, memOff := offs[0], offs[1]
			t.Run(fmt.Sprintf("size=%d/file+%d/mem+%d", size, fileOff, memOff), func(t *testing.T) {
				want := randomBytes(uint64(i)<<8|uint64(fileOff), size)
				src := upload(t, s.dev, want, memOff, size+memOff)
				defer s.dev.Free(src)
				if err := e.RegisterBuffer(src); err != nil {
					t.Fatal(err)
				}
				defer e.DeregisterBuffer(src)
				n, err := e.Write(ctx, f, src, memOff, fileOff, size)
				if err != nil || n != size {
					t.Fatalf("Write = %d, %v", n, err)
				}
				sameBytes(t, "file after write", fileBytes(t, path, fileOff, size), want)

				dst, err := s.dev.Alloc(size + 100)
				if err != nil {
					t.Fatal(err)
				}
				defer s.dev.Free(dst)
				n, err = e.Read(ctx, f, dst, 100, fileOff, size)
				if err != nil || n != size {
					t.Fatalf("Read = %d, %v", n, err)
				}
				sameBytes(t, "device after read", download(t, s.dev, dst, 100, size), want)
			})
		}
	}
	st := s.cufile(t)
	if st["max_io"] > block || st["max_io"] == 0 {
		t.Errorf("largest cuFile transfer was %d bytes, want 1..%d", st["max_io"], block)
	}
	if st["max_concurrent"] < 1 {
		t.Errorf("max concurrency %d", st["max_concurrent"])
	}
}

// TestEngineSplitsIntoBlocks checks the pieces a request becomes: one per
// block-aligned window of the file, each no larger than the block.
func TestEngineSplitsIntoBlocks(t *testing.T) {
	s := newStandins(t)
	e := openEngine(t, s, gds.Options{BlockSizeBytes: 64 << 10, Parallelism: 3})
	f, err := e.OpenFile(tempPath(t, "f"), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	m := upload(t, s.dev, randomBytes(1, 1<<20), 0, 1<<20)
	before := s.cufile(t)["calls"]
	// [1000, 1000+600000) touches windows 0..9 of 64 KiB: 10 pieces.
	if _, err := e.Write(context.Background(), f, m, 0, 1000, 600000); err != nil {
		t.Fatal(err)
	}
	st := s.cufile(t)
	if calls := st["calls"] - before; calls != 10 {
		t.Errorf("%d cuFileWrite calls, want 10", calls)
	}
	if st["max_io"] != 64<<10 {
		t.Errorf("largest piece %d, want %d", st["max_io"], 64<<10)
	}
	if got := e.Stats(); got.Pieces != 10 || got.WriteOps != 1 || got.WriteBytes != 600000 {
		t.Errorf("stats %+v", got)
	}
}

func TestEngineParallelism(t *testing.T) {
	s := newStandins(t)
	e := openEngine(t, s, gds.Options{BlockSizeBytes: 4096, Parallelism: 4})
	f, err := e.OpenFile(tempPath(t, "f"), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	m := upload(t, s.dev, randomBytes(2, 64<<10), 0, 64<<10)
	// Each call sleeps, so four goroutines issuing them overlap.
	t.Setenv("STANDIN_DELAY_US", "5000")
	if _, err := e.Write(context.Background(), f, m, 0, 0, 64<<10); err != nil {
		t.Fatal(err)
	}
	if c := s.cufile(t)["max_concurrent"]; c < 2 {
		t.Errorf("at most %d cuFileWrite calls ran at once with parallelism 4", c)
	}
}

func TestEngineRegistrationLifecycle(t *testing.T) {
	s := newStandins(t)
	e, err := gds.Open(s.dev, gds.Options{Library: s.cufileLib})
	if err != nil {
		t.Fatal(err)
	}
	if d := s.cufile(t)["driver"]; d != 1 {
		t.Fatalf("driver opens %d after Open", d)
	}
	a, _ := s.dev.Alloc(1 << 20)
	b, _ := s.dev.Alloc(1 << 20)
	for range 3 { // cached: registered once
		if err := e.RegisterBuffer(a); err != nil {
			t.Fatal(err)
		}
	}
	if err := e.RegisterBuffer(b); err != nil {
		t.Fatal(err)
	}
	if n := s.cufile(t)["bufs"]; n != 2 {
		t.Fatalf("%d buffers registered, want 2", n)
	}
	if err := e.DeregisterBuffer(b); err != nil {
		t.Fatal(err)
	}
	wantErr(t, e.DeregisterBuffer(b), accel.ErrInvalid, "not registered")

	var files []*gds.File
	for i := range 3 {
		f, err := e.OpenFile(tempPath(t, fmt.Sprint(i)), os.O_RDWR|os.O_CREATE, 0o600)
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, f)
	}
	if st := s.cufile(t); st["handles"] != 3 || st["bufs"] != 1 {
		t.Fatalf("before close: %v", st)
	}
	if err := files[0].Close(); err != nil {
		t.Fatal(err)
	}
	if err := files[0].Close(); err != nil {
		t.Fatalf("second file close: %v", err)
	}
	if n := s.cufile(t)["handles"]; n != 2 {
		t.Fatalf("%d handles after closing one of 3", n)
	}
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	st := s.cufile(t)
	for _, k := range []string{"driver", "handles", "bufs"} {
		if st[k] != 0 {
			t.Errorf("after Close, %s = %d, want 0", k, st[k])
		}
	}
	if err := e.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	// Everything fails cleanly afterwards.
	_, err = e.Read(context.Background(), files[1], a, 0, 0, 10)
	wantErr(t, err, aio.ErrClosed)
	_, err = e.OpenFile(tempPath(t, "late"), os.O_RDWR|os.O_CREATE, 0o600)
	wantErr(t, err, aio.ErrClosed)
	wantErr(t, e.RegisterBuffer(a), aio.ErrClosed)
}

func TestEngineDriverSharedBetweenEngines(t *testing.T) {
	s := newStandins(t)
	e1, err := gds.Open(s.dev, gds.Options{Library: s.cufileLib})
	if err != nil {
		t.Fatal(err)
	}
	e2, err := gds.Open(s.dev, gds.Options{Library: s.cufileLib})
	if err != nil {
		t.Fatal(err)
	}
	if err := gds.Available(gds.Options{Library: s.cufileLib, CUDA: cuda.Options{Library: s.cudaLib}}); err != nil {
		t.Fatal(err)
	}
	if d := s.cufile(t)["driver"]; d != 1 {
		t.Fatalf("driver opened %d times for two engines and a check", d)
	}
	e1.Close()
	if d := s.cufile(t)["driver"]; d != 1 {
		t.Fatalf("closing one engine closed the driver under the other")
	}
	e2.Close()
	if d := s.cufile(t)["driver"]; d != 0 {
		t.Fatalf("driver still open after both engines closed")
	}
}

func TestEngineErrors(t *testing.T) {
	s := newStandins(t)
	e := openEngine(t, s, gds.Options{BlockSizeBytes: 1 << 20, Parallelism: 1})
	ctx := context.Background()
	path := tempPath(t, "f")
	f, err := e.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	m := upload(t, s.dev, randomBytes(3, 4<<20), 0, 4<<20)

	t.Run("ENOSPC mid-request", func(t *testing.T) {
		t.Setenv("STANDIN_FAIL", "cuFileWrite:ENOSPC")
		t.Setenv("STANDIN_FAIL_AT", fmt.Sprint(2<<20))
		n, err := e.Write(ctx, f, m, 0, 0, 4<<20)
		wantErr(t, err, aio.ErrNoSpace, "write", path, "piece at file offset 2097152, device offset 2097152 (1048576 bytes)", "backend gds", "2097152 done")
		if n != 2<<20 {
			t.Errorf("bytes done %d, want the 2 pieces before the failure", n)
		}
		var oe *aio.OpError
		if !errors.As(err, &oe) || oe.Backend != "gds" || oe.Done != 2<<20 || oe.Offset != 0 || oe.Bytes != 4<<20 {
			t.Errorf("OpError %+v", oe)
		}
		var pe *gds.PieceError
		if !errors.As(err, &pe) || pe.FileOffset != 2<<20 {
			t.Errorf("PieceError %+v", pe)
		}
	})
	t.Run("EIO", func(t *testing.T) {
		t.Setenv("STANDIN_FAIL", "cuFileRead:EIO")
		_, err := e.Read(ctx, f, m, 0, 0, 4096)
		wantErr(t, err, aio.ErrIO, "read")
	})
	t.Run("cuFile status", func(t *testing.T) {
		t.Setenv("STANDIN_FAIL", "cuFileRead:-5011")
		_, err := e.Read(ctx, f, m, 0, 0, 4096)
		wantErr(t, err, nil, "cuFileRead failed: CU_FILE_CUDA_DRIVER_ERROR (5011)")
		var ce *gds.CuFileError
		if !errors.As(err, &ce) || ce.Code != 5011 {
			t.Errorf("CuFileError %+v", ce)
		}
	})
	t.Run("read past end of file", func(t *testing.T) {
		if err := os.Truncate(path, 10000); err != nil {
			t.Fatal(err)
		}
		n, err := e.Read(ctx, f, m, 0, 0, 20000)
		wantErr(t, err, aio.ErrShortTransfer, "end of file")
		if n != 10000 {
			t.Errorf("bytes done %d, want 10000", n)
		}
	})
	t.Run("bounds", func(t *testing.T) {
		_, err := e.Read(ctx, f, m, 4<<20-10, 0, 11)
		wantErr(t, err, accel.ErrBounds)
		_, err = e.Write(ctx, f, m, 0, -1, 10)
		wantErr(t, err, accel.ErrInvalid)
	})
	t.Run("canceled", func(t *testing.T) {
		cctx, cancel := context.WithCancel(ctx)
		cancel()
		_, err := e.Write(cctx, f, m, 0, 0, 4<<20)
		wantErr(t, err, context.Canceled)
	})
	t.Run("closed file", func(t *testing.T) {
		g, err := e.OpenFile(tempPath(t, "g"), os.O_RDWR|os.O_CREATE, 0o600)
		if err != nil {
			t.Fatal(err)
		}
		g.Close()
		_, err = e.Write(ctx, g, m, 0, 0, 10)
		wantErr(t, err, aio.ErrClosed)
	})
}

func TestEngineShortTransfersAndRetries(t *testing.T) {
	s := newStandins(t)
	e := openEngine(t, s, gds.Options{BlockSizeBytes: 1 << 20, Parallelism: 2})
	ctx := context.Background()
	path := tempPath(t, "f")
	f, err := e.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	const size = 3<<20 + 123
	want := randomBytes(4, size)
	m := upload(t, s.dev, want, 0, size)
	t.Setenv("STANDIN_SHORT", "100000") // every call moves at most 100000 bytes
	t.Setenv("STANDIN_EINTR", "1")      // and every other call is interrupted
	if n, err := e.Write(ctx, f, m, 0, 5, size); err != nil || n != size {
		t.Fatalf("Write = %d, %v", n, err)
	}
	sameBytes(t, "file", fileBytes(t, path, 5, size), want)
	dst, _ := s.dev.Alloc(size)
	if n, err := e.Read(ctx, f, dst, 0, 5, size); err != nil || n != size {
		t.Fatalf("Read = %d, %v", n, err)
	}
	sameBytes(t, "device", download(t, s.dev, dst, 0, size), want)
	st := e.Stats()
	if st.ShortTransfers == 0 || st.Retries == 0 {
		t.Errorf("stats %+v: want short transfers continued and EINTR retried", st)
	}
}

func TestEngineOpenFileErrors(t *testing.T) {
	s := newStandins(t)
	e := openEngine(t, s, gds.Options{Direct: aio.DirectOff})
	_, err := e.OpenFile(filepath.Join(t.TempDir(), "missing", "f"), os.O_RDWR, 0)
	wantErr(t, err, os.ErrNotExist)
	// A filesystem that needs O_DIRECT for GDS: the stand-in refuses the
	// buffered descriptor the way cuFile does.
	t.Setenv("STANDIN_REQUIRE_ODIRECT", "1")
	_, err = e.OpenFile(tempPath(t, "f"), os.O_RDWR|os.O_CREATE, 0o600)
	wantErr(t, err, nil, "cuFileHandleRegister", "CU_FILE_DIO_NOT_SET (5020)", "O_DIRECT: false")
	if n := s.cufile(t)["handles"]; n != 0 {
		t.Fatalf("%d handles after failed opens", n)
	}
}

func TestEngineFileFromOtherDeviceIO(t *testing.T) {
	s := newStandins(t)
	e1 := openEngine(t, s, gds.Options{})
	e2 := openEngine(t, s, gds.Options{})
	f, err := e1.OpenFile(tempPath(t, "f"), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	m, _ := s.dev.Alloc(4096)
	_, err = e2.Write(context.Background(), f, m, 0, 0, 4096)
	wantErr(t, err, nil, "opened by another DeviceIO")
}

func TestAvailable(t *testing.T) {
	t.Run("missing library", func(t *testing.T) {
		missing := filepath.Join(t.TempDir(), "libcufile.so.0")
		err := gds.Available(gds.Options{Library: missing})
		if !cudatest.CgoEnabled {
			wantErr(t, err, gds.ErrUnavailable, "built without cgo", "CGO_ENABLED=1")
			return
		}
		wantErr(t, err, gds.ErrUnavailable, "cannot load the cuFile library", missing, "No such file or directory", "ZINF_CUFILE_LIBRARY")
	})
	t.Run("library from environment", func(t *testing.T) {
		missing := filepath.Join(t.TempDir(), "env-cufile.so")
		t.Setenv(gds.LibraryEnv, missing)
		err := gds.Available(gds.Options{})
		wantErr(t, err, gds.ErrUnavailable)
		if cudatest.CgoEnabled {
			wantErr(t, err, nil, missing)
		}
	})
	t.Run("not a cuFile library", func(t *testing.T) {
		cudatest.RequireCgo(t)
		err := gds.Available(gds.Options{Library: "libm.so.6"})
		wantErr(t, err, gds.ErrUnavailable, "libm.so.6", "lacks cuFileDriverOpen")
	})
	t.Run("no GPU", func(t *testing.T) {
		s := newStandins(t)
		missing := filepath.Join(t.TempDir(), "libcuda.so.1")
		err := gds.Available(gds.Options{Library: s.cufileLib, CUDA: cuda.Options{Library: missing}})
		wantErr(t, err, gds.ErrUnavailable, "no usable GPU", "cannot load the CUDA driver library", missing)
		if !errors.Is(err, accel.ErrUnavailable) {
			t.Errorf("%v does not match accel.ErrUnavailable", err)
		}
		t.Setenv("STANDIN_FAIL", "cuInit:100")
		err = gds.Available(gds.Options{Library: s.cufileLib, CUDA: cuda.Options{Library: s.cudaLib}})
		wantErr(t, err, gds.ErrUnavailable, "no usable GPU", "cuInit failed", "CUDA_ERROR_NO_DEVICE")
	})
	t.Run("driver open fails", func(t *testing.T) {
		s := newStandins(t)
		t.Setenv("STANDIN_FAIL", "cuFileDriverOpen:5001")
		err := gds.Available(gds.Options{Library: s.cufileLib, CUDA: cuda.Options{Library: s.cudaLib}})
		wantErr(t, err, gds.ErrUnavailable, "cuFileDriverOpen", "CU_FILE_DRIVER_NOT_INITIALIZED (5001)")
		_, err = gds.Open(s.dev, gds.Options{Library: s.cufileLib})
		wantErr(t, err, gds.ErrUnavailable, "CU_FILE_DRIVER_NOT_INITIALIZED (5001)")
	})
	t.Run("works", func(t *testing.T) {
		s := newStandins(t)
		err := gds.Available(gds.Options{Library: s.cufileLib, CUDA: cuda.Options{Library: s.cudaLib}, Paths: []string{t.TempDir()}})
		if err != nil {
			t.Fatal(err)
		}
		if d := s.cufile(t)["driver"]; d != 0 {
			t.Fatalf("Available left the driver open (%d)", d)
		}
	})
	t.Run("path missing", func(t *testing.T) {
		s := newStandins(t)
		missing := filepath.Join(t.TempDir(), "nope")
		err := gds.Available(gds.Options{Library: s.cufileLib, CUDA: cuda.Options{Library: s.cudaLib}, Paths: []string{missing}})
		wantErr(t, err, gds.ErrUnavailable, "cannot check the filesystem of "+missing)
	})
}

// TestEngineOpenFileNoFollow opens files the way the swap store and zinf
// io do, with O_NOFOLLOW, which cuFile refuses in cuFileHandleRegister
// ("fd opened with unsupported flags", seen with cuFile 1.15 on an H200;
// the stand-in refuses it too). The engine registers a descriptor
// reopened without it, and the bytes go through; a link planted at the
// path is still refused.
func TestEngineOpenFileNoFollow(t *testing.T) {
	s := newStandins(t)
	e := openEngine(t, s, gds.Options{BlockSizeBytes: 1 << 20})
	ctx := context.Background()
	path := tempPath(t, "nofollow")
	f, err := e.OpenFile(path, os.O_RDWR|os.O_CREATE|syscall.O_NOFOLLOW, 0o600)
	if err != nil {
		t.Fatalf("OpenFile with O_NOFOLLOW: %v", err)
	}
	const size = 1<<20 + 4097
	want := randomBytes(99, size)
	src := upload(t, s.dev, want, 0, size)
	defer s.dev.Free(src)
	if n, err := e.Write(ctx, f, src, 0, 4096, size); err != nil || n != size {
		t.Fatalf("Write = %d, %v", n, err)
	}
	sameBytes(t, "file after write", fileBytes(t, path, 4096, size), want)
	dst, err := s.dev.Alloc(size)
	if err != nil {
		t.Fatal(err)
	}
	defer s.dev.Free(dst)
	if n, err := e.Read(ctx, f, dst, 0, 4096, size); err != nil || n != size {
		t.Fatalf("Read = %d, %v", n, err)
	}
	sameBytes(t, "device after read", download(t, s.dev, dst, 0, size), want)
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	if st := s.cufile(t); st["live_handles"] != 0 {
		t.Errorf("%d cuFile handles still registered after Close", st["live_handles"])
	}
	link := tempPath(t, "link")
	if err := os.Symlink(path, link); err != nil {
		t.Fatal(err)
	}
	if f, err := e.OpenFile(link, os.O_RDWR|syscall.O_NOFOLLOW, 0); err == nil {
		f.Close()
		t.Fatal("OpenFile followed a symbolic link under O_NOFOLLOW")
	}
}

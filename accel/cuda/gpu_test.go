package cuda_test

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"os"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/zinfio/zinf/accel/cuda"
)

// TestGPURoundTrip needs a real NVIDIA GPU and runs only with
// ZINF_GPU_TESTS=1: it copies 4 KiB to 1 GiB (aligned and not) to the
// device and back, from pageable Go memory and from registered mmap'ed
// memory, and compares the bytes.
func TestGPURoundTrip(t *testing.T) {
	if os.Getenv("ZINF_GPU_TESTS") != "1" {
		t.Skip("set ZINF_GPU_TESTS=1 to run the tests that need a real NVIDIA GPU")
	}
	info, err := cuda.Probe(cuda.Options{})
	if err != nil {
		t.Fatalf("ZINF_GPU_TESTS=1 but no GPU: %v", err)
	}
	t.Logf("%+v (CUDA %s)", info, info.DriverVersionString())
	d, err := cuda.Open(cuda.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := d.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	}()
	st, err := d.NewStream()
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	rng := rand.NewChaCha8([32]byte{42})
	for _, size := range []int{4096, 4097, 1<<20 + 1, 64 << 20, 256<<20 - 3, 1 << 30} {
		for _, pinned := range []bool{false, true} {
			t.Run(fmt.Sprintf("%d/registered=%v", size, pinned), func(t *testing.T) {
				src, dst := make([]byte, size), make([]byte, size)
				if pinned {
					var err error
					if src, err = unix.Mmap(-1, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANON); err != nil {
						t.Fatal(err)
					}
					defer unix.Munmap(src)
					if dst, err = unix.Mmap(-1, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANON); err != nil {
						t.Fatal(err)
					}
					defer unix.Munmap(dst)
					for _, b := range [][]byte{src, dst} {
						if err := d.RegisterHost(b); err != nil {
							t.Fatal(err)
						}
						defer d.UnregisterHost(b)
					}
				}
				rng.Read(src)
				m, err := d.Alloc(int64(size) + 256)
				if err != nil {
					t.Fatal(err)
				}
				defer d.Free(m)
				if err := d.CopyToDevice(st, m, 256, src); err != nil {
					t.Fatal(err)
				}
				if err := d.CopyFromDevice(st, dst, m, 256); err != nil {
					t.Fatal(err)
				}
				if err := st.Synchronize(); err != nil {
					t.Fatal(err)
				}
				if !bytes.Equal(src, dst) {
					t.Fatal("bytes differ after the round trip")
				}
			})
		}
	}
}

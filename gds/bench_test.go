package gds_test

import (
	"context"
	"fmt"
	"os"
	"testing"

	"github.com/zinfio/zinf/accel"
	"github.com/zinfio/zinf/aio"
	"github.com/zinfio/zinf/buffers"
	"github.com/zinfio/zinf/gds"
)

// BenchmarkBounce measures the bounce path to and from a simulated device
// with an unlimited link: what the staging machinery costs over aio.
func BenchmarkBounce(b *testing.B) {
	const size = 64 << 20
	for _, par := range []int{1, 4} {
		for _, op := range []string{"read", "write"} {
			b.Run(fmt.Sprintf("%s/parallelism=%d", op, par), func(b *testing.B) {
				sim, err := accel.NewSim(accel.SimOptions{CapacityBytes: size})
				if err != nil {
					b.Fatal(err)
				}
				defer sim.Close()
				eng, err := aio.New(aio.Options{IntraOpParallelism: par})
				if err != nil {
					b.Fatal(err)
				}
				defer eng.Close()
				pool, err := buffers.NewPool(buffers.Options{CapacityBytes: 16 << 20, Pin: buffers.PinOff})
				if err != nil {
					b.Fatal(err)
				}
				defer pool.Close()
				bio, err := gds.NewBounce(sim, eng, pool, gds.BounceOptions{BlockSizeBytes: 1 << 20, Parallelism: par})
				if err != nil {
					b.Fatal(err)
				}
				defer bio.Close()
				path := b.TempDir() + "/f"
				if err := os.WriteFile(path, make([]byte, size), 0o600); err != nil {
					b.Fatal(err)
				}
				f, err := bio.OpenFile(path, os.O_RDWR, 0)
				if err != nil {
					b.Fatal(err)
				}
				defer f.Close()
				m, err := sim.Alloc(size)
				if err != nil {
					b.Fatal(err)
				}
				ctx := context.Background()
				b.SetBytes(size)
				b.ReportAllocs()
				for b.Loop() {
					if op == "read" {
						_, err = bio.ReadToDevice(ctx, f, m, 0, 0, size)
					} else {
						_, err = bio.WriteFromDevice(ctx, f, m, 0, 0, size)
					}
					if err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}

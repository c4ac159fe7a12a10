package gds_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"github.com/zinfio/zinf/accel"
	"github.com/zinfio/zinf/aio"
	"github.com/zinfio/zinf/buffers"
	"github.com/zinfio/zinf/gds"
)

// ExampleSelect moves bytes from a file to a simulated device and back
// through the bounce path.
func ExampleSelect() {
	dev, _ := accel.NewSim(accel.SimOptions{CapacityBytes: 64 << 20})
	defer dev.Close()
	eng, _ := aio.New(aio.Options{Backend: aio.BackendPosix})
	defer eng.Close()
	pool, _ := buffers.NewPool(buffers.Options{CapacityBytes: 16 << 20, Pin: buffers.PinOff})
	defer pool.Close()

	dio, err := gds.Select(gds.ModeOff, dev, gds.SelectOptions{AIO: eng, Pool: pool})
	if err != nil {
		panic(err)
	}
	defer dio.Close()

	dir, _ := os.MkdirTemp("", "zinf-example-")
	defer os.RemoveAll(dir)
	path := filepath.Join(dir, "tensor")
	os.WriteFile(path, []byte("weights of layer 7"), 0o600)

	f, _ := dio.OpenFile(path, os.O_RDWR, 0)
	f.Truncate(4096) // swap files are preallocated: writes never extend them
	mem, _ := dev.Alloc(4096)
	ctx := context.Background()
	n, err := dio.ReadToDevice(ctx, f, mem, 0, 0, 18) // NVMe -> device
	fmt.Println(dio.Mode(), n, err)
	n, err = dio.WriteFromDevice(ctx, f, mem, 11, 100, 7) // "layer 7" -> offset 100
	fmt.Println(n, err)
	f.Close()

	b, _ := os.ReadFile(path)
	fmt.Printf("%q %d\n", b[100:107], len(b))
	// Output:
	// bounce 18 <nil>
	// 7 <nil>
	// "layer 7" 4096
}

package zinf_test

import (
	"errors"
	"os"
	"reflect"
	"sync/atomic"
	"testing"

	"github.com/zinfio/zinf"
	"github.com/zinfio/zinf/aio"
	"github.com/zinfio/zinf/config"
	"github.com/zinfio/zinf/tensor"
)

// countingEngine counts the files opened through it.
type countingEngine struct {
	aio.Engine
	opens atomic.Int32
}

func (e *countingEngine) Open(path string, flag int, perm os.FileMode) (*aio.File, error) {
	e.opens.Add(1)
	return e.Engine.Open(path, flag, perm)
}

// TestOpenPlansBeforeOpeningStores: Open plans from the stores' geometry
// as a value (plan.GeometryOf) and opens the swap stores only to build:
// a plan refused (a pool below its minimum) opens no file and leaves the
// NVMe path as it was, and the plan of a runtime that is built is the one
// PlanModel gives without opening anything.
func TestOpenPlansBeforeOpeningStores(t *testing.T) {
	dir := t.TempDir()
	cfg := config.Default()
	cfg.SetScratchDir(dir)
	cfg.ZeroOptimization.OffloadParam.MaxInCPU = 0
	cfg.Zinf.Bandwidth.Probe = false
	model := zinf.LayeredModel([]tensor.Desc{{Name: "a", Shape: []int{1 << 16}}}, []tensor.Desc{{Name: "b", Shape: []int{1 << 16}}})
	opts := zinf.Options{Logger: quietLog, NoBandwidthProbe: true}
	want, err := zinf.PlanModel(t.Context(), cfg, model, opts)
	if err != nil {
		t.Fatal(err)
	}
	inner, err := aio.New(aio.Options{Direct: aio.DirectOptional, Logger: quietLog})
	if err != nil {
		t.Fatal(err)
	}
	defer inner.Close()
	eng := &countingEngine{Engine: inner}
	opts.Engine = eng

	cfg.Zinf.Tiers.CPUPinnedBytes = config.Size(want.Reservations.MinPoolBytes - want.Reservations.GranuleBytes)
	_, err = zinf.Open(cfg, model, opts)
	var small *zinf.PoolTooSmallError
	if !errors.As(err, &small) {
		t.Fatalf("a pool one granule below the minimum: %v", err)
	}
	if n := eng.opens.Load(); n != 0 {
		t.Fatalf("a refused plan opened %d files", n)
	}
	if ents, err := os.ReadDir(dir); err != nil || len(ents) != 0 {
		t.Fatalf("a refused plan left %d entries in the NVMe path (%v)", len(ents), err)
	}

	cfg.Zinf.Tiers.CPUPinnedBytes = config.Size(2 * want.Reservations.MinPoolBytes)
	if want, err = zinf.PlanModel(t.Context(), cfg, model, opts); err != nil {
		t.Fatal(err)
	}
	rt, err := zinf.Open(cfg, model, opts)
	if err != nil {
		t.Fatal(err)
	}
	defer rt.Close()
	if eng.opens.Load() == 0 || rt.ParamStore == nil {
		t.Fatal("the runtime built no parameter store on the engine")
	}
	if got := rt.Reservations(); !reflect.DeepEqual(got, want.Reservations) {
		t.Fatalf("Open's reservations differ from PlanModel's:\n open %+v\n plan %+v", got, want.Reservations)
	}
	if got := rt.DiskNeeds(); !reflect.DeepEqual(got, want.Disk) {
		t.Fatalf("Open's disk needs differ from PlanModel's: %v, %v", got, want.Disk)
	}
}

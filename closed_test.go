package zinf_test

import (
	"context"
	"errors"
	"reflect"
	"testing"

	"github.com/zinfio/zinf"
	"github.com/zinfio/zinf/comm"
	"github.com/zinfio/zinf/swapper/param"
	"github.com/zinfio/zinf/tensor"
)

// TestErrClosed: after Close, every loop method returns an error matching
// the one top-level sentinel zinf.ErrClosed (and still the layer's own).
func TestErrClosed(t *testing.T) {
	c, _ := testConfig(t)
	m := oneTensor("w", 5000)
	rt, err := zinf.Open(c, m, zinf.Options{NoBandwidthProbe: true})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	w := make([]float32, 5000)
	if err := rt.Init(ctx, "w", w); err != nil {
		t.Fatal(err)
	}
	if err := rt.Close(); err != nil {
		t.Fatal(err)
	}
	calls := map[string]func() error{
		"BeginLayer":         func() error { return rt.BeginLayer(ctx, 0) },
		"ReadParam":          func() error { return rt.ReadParam(ctx, "w", w) },
		"AccumulateGrad":     func() error { return rt.AccumulateGrad(ctx, "w", w) },
		"Step":               func() error { return rt.Step(ctx) },
		"ReadOptimizerState": func() error { _, _, _, err := rt.ReadOptimizerState(ctx, "w"); return err },
	}
	for name, call := range calls {
		err := call()
		if !errors.Is(err, zinf.ErrClosed) {
			t.Errorf("%s after Close: %v, want an error matching zinf.ErrClosed", name, err)
		}
	}
	if err := rt.ReadParam(ctx, "w", w); !errors.Is(err, param.ErrClosed) {
		t.Errorf("ReadParam after Close: %v, want param.ErrClosed too", err)
	}
}

// TestErrClosedFirst: a closed runtime says it is closed before anything
// else that is wrong with a call (an uninitialised tensor, an unknown
// name, a wrong length): every public method that can fail checks it
// first.
func TestErrClosedFirst(t *testing.T) {
	c, _ := testConfig(t)
	m := zinf.LayeredModel([]tensor.Desc{{Name: "a", Shape: []int{300}}}, []tensor.Desc{{Name: "b", Shape: []int{200}}})
	rt, err := zinf.Open(c, m, zinf.Options{NoBandwidthProbe: true})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := rt.Init(ctx, "a", make([]float32, 300)); err != nil {
		t.Fatal(err)
	}
	if err := rt.Close(); err != nil {
		t.Fatal(err)
	}
	short := make([]float32, 7) // the wrong length for every tensor
	calls := map[string]func() error{
		"Step":                 func() error { return rt.Step(ctx) },
		"Init":                 func() error { return rt.Init(ctx, "b", make([]float32, 200)) },
		"BeginLayer":           func() error { return rt.BeginLayer(ctx, 1) },
		"ReadParam":            func() error { return rt.ReadParam(ctx, "b", short) },
		"ReadParamBytes":       func() error { return rt.ReadParamBytes(ctx, "b", tensor.Float32, make([]byte, 3)) },
		"AccumulateGrad":       func() error { return rt.AccumulateGrad(ctx, "nope", short) },
		"StepTensor":           func() error { return rt.StepTensor(ctx, "nope") },
		"StepLayer":            func() error { return rt.StepLayer(ctx, 1) },
		"ReduceGrad":           func() error { return rt.ReduceGrad(ctx, "b", short, 1) },
		"ReduceGrads":          func() error { return rt.ReduceGrads(ctx, "b", [][]float32{short}, zinf.GradReduce{}) },
		"Collective":           func() error { return rt.Collective(ctx, func(comm.Comm) error { return nil }) },
		"SetLR":                func() error { return rt.SetLR(0.1) },
		"ReadOptimizerState":   func() error { _, _, _, err := rt.ReadOptimizerState(ctx, "b"); return err },
		"ReadOptimizerStates":  func() error { _, _, err := rt.ReadOptimizerStates(ctx, "nope"); return err },
		"VisitOptimizerStates": func() error { return rt.VisitOptimizerStates(ctx, "b", nil) },
		"CheckpointState": func() error {
			_, err := zinf.CheckpointState([]*zinf.Runtime{rt}, zinf.CheckpointMeta{})
			return err
		},
	}
	for name, call := range calls {
		if err := call(); !errors.Is(err, zinf.ErrClosed) {
			t.Errorf("%s after Close: %v, want an error matching zinf.ErrClosed", name, err)
		}
	}
}

// TestErrClosedEveryMethod: every exported method of a Runtime that
// returns an error (Close aside), called after Close with zero arguments,
// returns an error matching zinf.ErrClosed, and does not panic: a method
// added without the check fails here.
func TestErrClosedEveryMethod(t *testing.T) {
	c, _ := testConfig(t)
	rt, err := zinf.Open(c, oneTensor("w", 100), zinf.Options{NoBandwidthProbe: true})
	if err != nil {
		t.Fatal(err)
	}
	if err := rt.Close(); err != nil {
		t.Fatal(err)
	}
	ctxType := reflect.TypeFor[context.Context]()
	errType := reflect.TypeFor[error]()
	v := reflect.ValueOf(rt)
	checked := 0
	for i := range v.NumMethod() {
		m, mt := v.Method(i), v.Type().Method(i)
		ft := m.Type()
		if mt.Name == "Close" || ft.NumOut() == 0 || ft.Out(ft.NumOut()-1) != errType {
			continue
		}
		args := make([]reflect.Value, ft.NumIn())
		for j := range args {
			if ft.In(j) == ctxType {
				args[j] = reflect.ValueOf(context.Background())
			} else {
				args[j] = reflect.Zero(ft.In(j))
			}
		}
		func() {
			defer func() {
				if p := recover(); p != nil {
					t.Errorf("%s after Close panicked: %v", mt.Name, p)
				}
			}()
			out := m.Call(args)
			err, _ := out[len(out)-1].Interface().(error)
			if !errors.Is(err, zinf.ErrClosed) {
				t.Errorf("%s after Close: %v, want an error matching zinf.ErrClosed", mt.Name, err)
			}
		}()
		checked++
	}
	if checked < 20 {
		t.Errorf("checked %d methods; the Runtime has more that return errors", checked)
	}
}

package zinf_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/zinfio/zinf"
	"github.com/zinfio/zinf/checkpoint"
	"github.com/zinfio/zinf/comm"
	"github.com/zinfio/zinf/config"
	"github.com/zinfio/zinf/tensor"
)

// distModel has odd shapes: a tensor smaller than the world (empty
// partitions), a one-element bias, an empty layer, a large-ish layer.
func distModel() zinf.Model {
	return zinf.LayeredModel(
		[]tensor.Desc{{Name: "l0.w", Shape: []int{37, 5}}, {Name: "l0.b", Shape: []int{1}}},
		[]tensor.Desc{{Name: "l1.w", Shape: []int{3}}},
		nil,
		[]tensor.Desc{{Name: "l3.w", Shape: []int{64, 33}}, {Name: "l3.b", Shape: []int{33}}},
	)
}

// localGrad is data rank d's own gradient of w: 0.5*||w - target_d||^2,
// with a target per data rank, so that the sum over ranks depends on its
// order in the last bits.
func localGrad(w []float32, d int) []float32 {
	g := make([]float32, len(w))
	for i := range w {
		g[i] = w[i] - float32((i*(d+3))%11)/float32(7+d) + float32(d)*1e-3
	}
	return g
}

// onRanks runs f on every rank's goroutine and returns their errors.
func onRanks(n int, f func(r int) error) []error {
	errs := make([]error, n)
	var wg sync.WaitGroup
	for r := range n {
		wg.Go(func() { errs[r] = f(r) })
	}
	wg.Wait()
	return errs
}

// distRun trains steps with ranks as goroutines over an in-process world
// of procs ranks standing in for data data-parallel ranks (consecutive
// blocks, as a job resumed at another world size would): each rank opens
// its own runtime with GatherLayers, reads full parameters, hands its
// own gradients through ReduceGrads (scaled by 1/data) and steps. Every
// read is checked against ref, in-memory Adam over the rank-ordered
// mean of the data ranks' gradients, and at the end every rank's
// optimizer states.
func distRun(t *testing.T, ctx context.Context, cfg *config.Config, model zinf.Model, procs, data, steps int, overlap bool) {
	t.Helper()
	init := initValues(model)
	ref := newAdamRef(cfg, init)
	comms, err := comm.NewLocal(procs, comm.LocalOptions{StallTimeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	per := make([]int, procs)
	first := make([]int, procs)
	for p := range procs {
		lo, hi := p*data/procs, (p+1)*data/procs
		first[p], per[p] = lo, hi-lo
	}
	rts := make([]*zinf.Runtime, procs)
	for r := range procs {
		rts[r], err = zinf.Open(cfg, model, zinf.Options{Rank: r, WorldSize: procs, Comm: comms[r], GatherLayers: true, SerialStep: !overlap})
		if err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
		defer rts[r].Close()
	}
	// The reference's steps, computed up front: each step's gradient is
	// the rank-ordered mean over the data ranks of localGrad at the
	// weights of that step.
	refWeights := []map[string][]float32{}
	for s := range steps + 1 {
		snap := map[string][]float32{}
		for n, w := range ref.w {
			snap[n] = append([]float32(nil), w...)
		}
		refWeights = append(refWeights, snap)
		if s == steps {
			break
		}
		grads := map[string][]float32{}
		for n, w := range ref.w {
			sum := localGrad(w, 0)
			for d := 1; d < data; d++ {
				for i, x := range localGrad(w, d) {
					sum[i] += x
				}
			}
			if data > 1 {
				for i := range sum {
					sum[i] *= 1 / float32(data)
				}
			}
			grads[n] = sum
		}
		ref.apply(grads)
	}
	layers := rts[0].Layers()
	errs := onRanks(procs, func(r int) error {
		rt := rts[r]
		for name, w := range init {
			if err := rt.Init(ctx, name, w); err != nil {
				return err
			}
		}
		read := func(step, l int) (map[string][]float32, error) {
			if err := rt.BeginLayer(ctx, l); err != nil {
				return nil, err
			}
			out := map[string][]float32{}
			for _, name := range rt.LayerTensors(l) {
				full := make([]float32, len(init[name]))
				if err := rt.ReadParam(ctx, name, full); err != nil {
					return nil, err
				}
				for i, want := range refWeights[step][name] {
					if math.Float32bits(full[i]) != math.Float32bits(want) {
						return nil, fmt.Errorf("step %d: %s[%d] reads %v, in-memory Adam has %v", step, name, i, full[i], want)
					}
				}
				out[name] = full
			}
			return out, nil
		}
		for step := 0; step <= steps; step++ {
			rt.Forward()
			for l := range layers {
				if _, err := read(step, l); err != nil {
					return err
				}
				rt.EndLayer(l)
			}
			if step == steps {
				break
			}
			rt.Backward()
			for l := layers - 1; l >= 0; l-- {
				ws, err := read(step, l)
				if err != nil {
					return err
				}
				for _, name := range rt.LayerTensors(l) {
					var mine [][]float32
					for k := range per[r] {
						mine = append(mine, localGrad(ws[name], first[r]+k))
					}
					if err := rt.ReduceGrads(ctx, name, mine, zinf.GradReduce{Per: per, Scale: 1 / float32(data)}); err != nil {
						return err
					}
					if err := rt.StepTensor(ctx, name); err != nil {
						return err
					}
				}
				rt.EndLayer(l)
			}
			if err := rt.Step(ctx); err != nil {
				return err
			}
		}
		for name := range init {
			master, m, v, err := rt.ReadOptimizerState(ctx, name)
			if err != nil {
				return err
			}
			lo, hi := rt.Partition(name)
			for k, c := range [][2][]float32{{master, ref.w[name]}, {m, ref.m[name]}, {v, ref.v[name]}} {
				want := c[1][lo:hi]
				for i := range want {
					if math.Float32bits(c[0][i]) != math.Float32bits(want[i]) {
						return fmt.Errorf("%s state %d [%d]: %v, in-memory %v", name, k, lo+i, c[0][i], want[i])
					}
				}
			}
		}
		return nil
	})
	for r, err := range errs {
		if err != nil {
			t.Errorf("rank %d: %v", r, err)
		}
	}
	m := rts[0].Metrics().Comm
	if procs > 1 && (m.Gathers == 0 || m.ReduceScatters == 0 || m.GatheredAhead == 0) {
		t.Errorf("rank 0 counts %+v: gathers, reduce-scatters and gathers ahead expected", m)
	}
}

// TestGatherLayers trains ranks as goroutines of an in-process world
// (the MPI world's code path, with comm.NewLocal) at world sizes 1 to 4,
// and 2 and 3 processes standing in for 4 and 3 data-parallel ranks:
// every full parameter each rank reads, and every rank's optimizer
// states, equal in-memory Adam over the rank-ordered mean gradient bit
// for bit.
func TestGatherLayers(t *testing.T) {
	ctx, _ := watchdog(t, 5*time.Minute)
	for _, c := range []struct{ procs, data int }{{1, 1}, {2, 2}, {3, 3}, {4, 4}, {2, 4}, {2, 3}, {3, 2}} {
		for _, overlap := range []bool{false, true} {
			t.Run(fmt.Sprintf("procs%d-data%d-overlap%v", c.procs, c.data, overlap), func(t *testing.T) {
				cfg, _ := testConfig(t)
				distRun(t, ctx, cfg, distModel(), c.procs, c.data, 3, overlap)
			})
		}
	}
}

// TestGatherLayersErrors: GatherLayers without a Comm, a Comm of another
// rank, a layer begun while two are held, ReduceGrad without a Comm or
// with bad arguments.
func TestGatherLayersErrors(t *testing.T) {
	cfg, _ := testConfig(t)
	model := distModel()
	if _, err := zinf.Open(cfg, model, zinf.Options{GatherLayers: true}); err == nil {
		t.Fatal("GatherLayers without Comm accepted")
	}
	comms, _ := comm.NewLocal(2, comm.LocalOptions{})
	if _, err := zinf.Open(cfg, model, zinf.Options{Rank: 0, WorldSize: 2, Comm: comms[1]}); err == nil {
		t.Fatal("a Comm of rank 1 accepted for rank 0")
	}
	rt, err := zinf.Open(cfg, model, zinf.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer rt.Close()
	if err := rt.ReduceGrad(context.Background(), "l0.w", make([]float32, 185), 1); err == nil {
		t.Fatal("ReduceGrad without a Comm accepted")
	}
}

// TestGatherLayersAbort: a rank that aborts its Comm while the others
// gather ends every rank's BeginLayer with an error naming it.
func TestGatherLayersAbort(t *testing.T) {
	ctx, _ := watchdog(t, 2*time.Minute)
	cfg, _ := testConfig(t)
	model := distModel()
	init := initValues(model)
	comms, _ := comm.NewLocal(3, comm.LocalOptions{})
	boom := errors.New("rank 1 ran out of disk")
	errs := onRanks(3, func(r int) error {
		rt, err := zinf.Open(cfg, model, zinf.Options{Rank: r, WorldSize: 3, Comm: comms[r], GatherLayers: true})
		if err != nil {
			return err
		}
		defer rt.Close()
		for name, w := range init {
			if err := rt.Init(ctx, name, w); err != nil {
				return err
			}
		}
		rt.Forward()
		for l := range rt.Layers() {
			if r == 1 && l == 1 {
				comms[r].Abort(boom)
			}
			if err := rt.BeginLayer(ctx, l); err != nil {
				return err
			}
			rt.EndLayer(l)
		}
		return nil
	})
	for r, err := range errs {
		var re *comm.RankError
		if !errors.As(err, &re) || re.Rank != 1 || !errors.Is(err, boom) {
			t.Errorf("rank %d: %v, want an error naming rank 1 and its cause", r, err)
		}
	}
}

// TestGatherLayersMinimumPool: the gathered layers have a reservation of
// their own, counted in the minimum pool; at exactly the largest rank's
// minimum every rank trains bit for bit, one granule below Open refuses
// naming zinf.tiers.cpu_pinned_bytes.
func TestGatherLayersMinimumPool(t *testing.T) {
	ctx, _ := watchdog(t, 3*time.Minute)
	cfg, _ := testConfig(t)
	model := distModel()
	const procs = 3
	comms, _ := comm.NewLocal(procs, comm.LocalOptions{})
	var need, granule int64
	for r := range procs {
		rt, err := zinf.Open(cfg, model, zinf.Options{Rank: r, WorldSize: procs, Comm: comms[r], GatherLayers: true})
		if err != nil {
			t.Fatal(err)
		}
		res := rt.Reservations()
		rt.Close()
		if res.GatherBytes == 0 {
			t.Fatalf("rank %d: no reservation for the gathered layers: %+v", r, res)
		}
		need, granule = max(need, res.MinPoolBytes), res.GranuleBytes
	}
	cfg.Zinf.Tiers.CPUPinnedBytes = config.Size(need)
	distRun(t, ctx, cfg, model, procs, procs, 2, true)
	cfg.Zinf.Tiers.CPUPinnedBytes = config.Size(need - granule)
	comms, _ = comm.NewLocal(procs, comm.LocalOptions{})
	refused := 0
	for r := range procs {
		rt, err := zinf.Open(cfg, model, zinf.Options{Rank: r, WorldSize: procs, Comm: comms[r], GatherLayers: true})
		if err == nil {
			rt.Close()
			continue
		}
		if !errors.Is(err, zinf.ErrPoolTooSmall) {
			t.Fatalf("rank %d: %v", r, err)
		}
		refused++
	}
	if refused == 0 {
		t.Fatal("one granule below the minimum, every rank opened")
	}
}

// TestSaveCheckpointShared: ranks as goroutines (as processes would) save
// one checkpoint together after a step, each its own runtime; loaded into
// the in-process world of another size, every optimizer state and
// parameter equals what the saving ranks held.
func TestSaveCheckpointShared(t *testing.T) {
	ctx, _ := watchdog(t, 2*time.Minute)
	cfg, _ := testConfig(t)
	model := distModel()
	init := initValues(model)
	const procs = 3
	comms, _ := comm.NewLocal(procs, comm.LocalOptions{})
	root := t.TempDir()
	dir := root + "/step-000001"
	type state struct{ master, m, v []float32 }
	saved := make([]map[string]state, procs)
	errs := onRanks(procs, func(r int) error {
		rt, err := zinf.Open(cfg, model, zinf.Options{Rank: r, WorldSize: procs, Comm: comms[r], GatherLayers: true})
		if err != nil {
			return err
		}
		defer rt.Close()
		for _, d := range model.Tensors {
			if err := rt.Init(ctx, d.Name, init[d.Name]); err != nil {
				return err
			}
		}
		rt.Backward()
		for l := rt.Layers() - 1; l >= 0; l-- {
			if err := rt.BeginLayer(ctx, l); err != nil {
				return err
			}
			for _, name := range rt.LayerTensors(l) {
				if err := rt.ReduceGrad(ctx, name, localGrad(init[name], r), 1/float32(procs)); err != nil {
					return err
				}
			}
			rt.EndLayer(l)
		}
		if err := rt.Step(ctx); err != nil {
			return err
		}
		saved[r] = map[string]state{}
		for name := range init {
			master, m, v, err := rt.ReadOptimizerState(ctx, name)
			if err != nil {
				return err
			}
			saved[r][name] = state{master, m, v}
		}
		_, err = zinf.SaveCheckpointShared(ctx, dir, rt, zinf.CheckpointMeta{Step: 1}, checkpoint.SaveOptions{})
		return err
	})
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
	}
	if _, err := checkpoint.Verify(ctx, dir); err != nil {
		t.Fatalf("verify: %v", err)
	}
	// Load at world 2, in one process.
	var rts []*zinf.Runtime
	for r := range 2 {
		rt, err := zinf.Open(cfg, model, zinf.Options{Rank: r, WorldSize: 2})
		if err != nil {
			t.Fatal(err)
		}
		defer rt.Close()
		rts = append(rts, rt)
	}
	for _, rt := range rts {
		for _, d := range model.Tensors { // one registration order on every rank
			if err := rt.Init(ctx, d.Name, init[d.Name]); err != nil {
				t.Fatal(err)
			}
		}
	}
	if _, err := zinf.LoadCheckpoint(ctx, dir, rts); err != nil {
		t.Fatal(err)
	}
	for name := range init {
		var want state
		for r := range procs {
			s := saved[r][name]
			want.master, want.m, want.v = append(want.master, s.master...), append(want.m, s.m...), append(want.v, s.v...)
		}
		var got state
		for _, rt := range rts {
			master, m, v, err := rt.ReadOptimizerState(ctx, name)
			if err != nil {
				t.Fatal(err)
			}
			got.master, got.m, got.v = append(got.master, master...), append(got.m, m...), append(got.v, v...)
		}
		for k, pair := range [][2][]float32{{got.master, want.master}, {got.m, want.m}, {got.v, want.v}} {
			if len(pair[0]) != len(pair[1]) {
				t.Fatalf("%s state %d: %d elements, saved %d", name, k, len(pair[0]), len(pair[1]))
			}
			for i := range pair[0] {
				if math.Float32bits(pair[0][i]) != math.Float32bits(pair[1][i]) {
					t.Fatalf("%s state %d [%d]: loaded %v, saved %v", name, k, i, pair[0][i], pair[1][i])
				}
			}
		}
	}
}

// TestGatherLayersRepeatingPasses: with GatherLayers, passes announced by
// ForwardRepeating gather the next pass's first layer ahead at the last
// layer of each pass (as each pass gathers its next layer ahead), so
// after the first pass every layer of every pass was gathered ahead;
// passes announced by Forward start on a gather on demand. Every rank
// reads the full parameters, the same collectives on every rank;
// ReleasePrefetched drops the gather left ahead and the pinned memory
// goes back to what it was before the passes.
func TestGatherLayersRepeatingPasses(t *testing.T) {
	ctx, _ := watchdog(t, 2*time.Minute)
	const procs, passes = 2, 3
	cfg, _ := testConfig(t)
	model := distModel()
	init := initValues(model)
	comms, err := comm.NewLocal(procs, comm.LocalOptions{StallTimeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	rts := make([]*zinf.Runtime, procs)
	for r := range procs {
		if rts[r], err = zinf.Open(cfg, model, zinf.Options{Rank: r, WorldSize: procs, Comm: comms[r], GatherLayers: true, Inference: true}); err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
		defer rts[r].Close()
	}
	layers := rts[0].Layers()
	ahead := make([][]int64, procs) // GatheredAhead after each pass, per rank
	inUse := make([][2]int64, procs)
	errs := onRanks(procs, func(r int) error {
		rt := rts[r]
		for name, w := range init {
			if err := rt.Init(ctx, name, w); err != nil {
				return err
			}
		}
		inUse[r][0] = rt.Metrics().PinnedInUseBytes
		pass := func(start func()) error {
			start()
			for l := range layers {
				if err := rt.BeginLayer(ctx, l); err != nil {
					return err
				}
				for _, name := range rt.LayerTensors(l) {
					full := make([]float32, len(init[name]))
					if err := rt.ReadParam(ctx, name, full); err != nil {
						return err
					}
					if !slices.Equal(full, init[name]) {
						return fmt.Errorf("%s: read %v..., want %v...", name, full[:1], init[name][:1])
					}
				}
				rt.EndLayer(l)
			}
			ahead[r] = append(ahead[r], rt.Metrics().Comm.GatheredAhead)
			return nil
		}
		for range passes {
			if err := pass(rt.Forward); err != nil {
				return err
			}
		}
		for range passes {
			if err := pass(rt.ForwardRepeating); err != nil {
				return err
			}
		}
		rt.ReleasePrefetched()
		inUse[r][1] = rt.Metrics().PinnedInUseBytes
		return nil
	})
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
	}
	for r := range procs {
		// A layer gathered ahead is counted when it is begun.
		var got []int64
		for i, a := range ahead[r] {
			prev := int64(0)
			if i > 0 {
				prev = ahead[r][i-1]
			}
			got = append(got, a-prev)
		}
		want := []int64{}
		for range passes {
			want = append(want, int64(layers-1)) // Forward: the first layer on demand
		}
		want = append(want, int64(layers-1)) // the first repeating pass starts on demand too
		for range passes - 1 {
			want = append(want, int64(layers)) // then every layer was gathered ahead
		}
		if !slices.Equal(got, want) {
			t.Errorf("rank %d: layers gathered ahead per pass %v, want %v", r, got, want)
		}
		if inUse[r][1] != inUse[r][0] {
			t.Errorf("rank %d: %d pinned bytes in use after ReleasePrefetched, %d before the passes", r, inUse[r][1], inUse[r][0])
		}
	}
}

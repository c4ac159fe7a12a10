package zinf_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/zinfio/zinf"
	"github.com/zinfio/zinf/aio"
	"github.com/zinfio/zinf/buffers"
	"github.com/zinfio/zinf/comm"
	"github.com/zinfio/zinf/config"
	"github.com/zinfio/zinf/internal/test/faults"
	"github.com/zinfio/zinf/internal/test/testenv"
	"github.com/zinfio/zinf/plan"
	"github.com/zinfio/zinf/swapper/optimizer"
	"github.com/zinfio/zinf/tensor"
)

// TestMetamorphic trains random models — prime sizes, up to thousands of
// tiny tensors,
// empty partitions at world up to 4, a tensor near the pool's size,
// fp32/bf16/fp16 — with random pool sizes from below the runtime's
// minimum to generous, random prefetch and pipeline depths, micro-steps
// and overlap, through the public API only, in random call orders the
// docs allow (Init order, Forward/Backward or Pass with a custom order,
// StepLayer or not, ReadParam or ReadParamBytes in any dtype, extra
// forward passes, Metrics polled from another goroutine) and with random
// injected faults: ENOSPC or EIO on writes during Init, gradient
// write-behind and the step, after which space returns and the call the
// docs say to retry (Init, AccumulateGrad, Step) is retried. Every run is
// either refused at Open with a PoolTooSmallError (and then its pool
// really is below the minimum a generous open reports) or trains to the
// end bit-for-bit equal to an in-memory reference. Each run has a
// watchdog that fails it and prints the pool's holders.
//
// make test runs five seeds from the clock (each run explores new ones);
// ZINF_TEST_SEED reproduces one seed; ZINF_STRESS=1 runs many more
// (ZINF_STRESS_SEEDS sets how many).
func TestMetamorphic(t *testing.T) {
	stressSeeds := 200
	if s := os.Getenv("ZINF_STRESS_SEEDS"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 {
			t.Fatalf("ZINF_STRESS_SEEDS=%q: want a positive count", s)
		}
		stressSeeds = n
	}
	seeds := testenv.Seeds(t, 5, stressSeeds)
	var hits, refused atomic.Int64
	for _, seed := range seeds {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			t.Logf("seed %d (reproduce with ZINF_TEST_SEED=%d)", seed, seed)
			h, r := metamorphicRun(t, seed)
			hits.Add(int64(h))
			if r {
				refused.Add(1)
			}
		})
	}
	t.Logf("%d seeds: %d refused up front, %d injected faults", len(seeds), refused.Load(), hits.Load())
	if len(seeds) >= 8 && hits.Load() == 0 && !t.Failed() {
		t.Errorf("%d seeds and not one injected fault fired: the fault seam is not reached", len(seeds))
	}
}

// stalledSeeds are seeds that once failed; TestMetamorphicKnownSeeds
// runs them on every make test. 1795746247277799838 (3 layers, world 2,
// micro 2 layer-major under a micro-batch-major plan, bf16, the pool at
// its minimum) stalled under -race in 3 runs of 7: a layer's small
// partitions, placed around the previous layer's, left the parameter
// region 276 of 288 KiB free and no aligned 128 KiB block for its 88 KiB
// partition (the mechanism, deterministically: swapper/param's
// TestWaitFragmentedRegion and TestStageFragmentedRegion).
// 1795774739014017161 (5 layers, 2004 tiny tensors, world 2, fp16,
// prefetch 2) ran into the watchdog under -race when every swap-in
// waiting for its turn at the pool was woken, and rescanned every
// flight, whenever one got there (3067 flights; a chain of single waits
// since). 1796183982732895722 (2 layers, world 2, fp16, layer-major,
// zinf.overlap_update) read a parameter as it was before the last step
// in 7 runs of 30: the step's update failed (an injected ENOSPC) after
// the read had waited for its publication and while its publications
// were being put back, and the read returned the old value without an
// error (Runtime.checkRead since).
var stalledSeeds = []uint64{1795746247277799838, 1795774739014017161, 1796183982732895722}

// TestMetamorphicKnownSeeds runs the seeds that once failed.
func TestMetamorphicKnownSeeds(t *testing.T) {
	for _, seed := range stalledSeeds {
		t.Run(fmt.Sprint(seed), func(t *testing.T) { metamorphicRun(t, seed) })
	}
}

var primes = []int{1, 2, 3, 5, 7, 11, 13, 31, 61, 127, 251, 509, 1021, 2039, 4093, 8191}

// randomModel builds a random layered model.
func randomModel(rng *rand.Rand) (zinf.Model, int) {
	layers := 1 + rng.IntN(4)
	var ls [][]tensor.Desc
	n := 0
	for l := range layers {
		var ts []tensor.Desc
		for range rng.IntN(4) { // an empty layer is allowed
			shape := []int{primes[rng.IntN(len(primes))]}
			if rng.IntN(3) == 0 {
				shape = append(shape, primes[rng.IntN(6)])
			}
			ts = append(ts, tensor.Desc{Name: fmt.Sprintf("t%d.%d", l, n), Shape: shape})
			n++
		}
		ls = append(ls, ts)
	}
	if rng.IntN(3) == 0 { // many tiny tensors: tens, hundreds or thousands
		var ts []tensor.Desc
		count := []int{40, 400, 1000 + rng.IntN(1000)}[rng.IntN(3)]
		for range count {
			ts = append(ts, tensor.Desc{Name: fmt.Sprintf("tiny.%d", n), Shape: []int{1 + rng.IntN(3)}})
			n++
		}
		ls = append(ls, ts)
	}
	if rng.IntN(3) == 0 { // one large tensor
		ls = append(ls, []tensor.Desc{{Name: "big", Shape: []int{300_007 + rng.IntN(100_000)}}})
	}
	if n == 0 {
		ls = append(ls, []tensor.Desc{{Name: "only", Shape: []int{17}}})
	}
	return zinf.LayeredModel(ls...), len(ls)
}

// metamorphicRun runs one seed; it returns the faults injected and
// whether Open refused the pool up front.
func metamorphicRun(t *testing.T, seed uint64) (hits int, refused bool) {
	rng := rand.New(rand.NewPCG(seed, 0x5eed))
	model, layers := randomModel(rng)
	world := 1 + rng.IntN(4)
	micro := 1 + rng.IntN(2)
	steps := 2 + rng.IntN(2)
	dir := t.TempDir()
	cfg := config.Default()
	cfg.SetScratchDir(dir)
	// The schedule: the plan's (which sizes the gradients' pinned memory)
	// and the loop's order, drawn apart — a loop may run either order
	// whatever the plan says, with the same bits.
	layerMajor := rng.IntN(2) == 0
	if layerMajor {
		micro = 1 + rng.IntN(4)
	}
	cfg.GradientAccumulationSteps = micro
	cfg.Zinf.Schedule = []config.ScheduleMode{config.ScheduleAuto, config.ScheduleLayerMajor, config.ScheduleMicroBatchMajor}[rng.IntN(3)]
	cfg.ZeroOptimization.OffloadParam.MaxInCPU = int64(rng.IntN(3)) * 10_000
	cfg.ZeroOptimization.SubGroupSize = int64([]int{1000, 16384, 1 << 20}[rng.IntN(3)])
	cfg.Zinf.PipelineDepth = rng.IntN(3)
	switch rng.IntN(3) {
	case 1:
		cfg.BF16 = true
	case 2:
		cfg.FP16 = true
	}
	if rng.IntN(4) == 0 {
		cfg.ZeroOptimization.OffloadOptimizer.Device = config.OffloadCPU
	}
	cfg.Zinf.Tiers.CPUPinnedBytes = 256 << 20 // generous, to learn the minimum
	// Drawn apart, so that the seeds of stalledSeeds still draw what they
	// drew: Step returning before its update commits.
	cfg.Zinf.OverlapUpdate = rand.New(rand.NewPCG(seed, 0x0fe1)).IntN(2) == 0
	if err := cfg.Validate(); err != nil {
		t.Fatalf("config: %v", err)
	}
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	opts := zinf.Options{Logger: quiet, WorldSize: world, SerialStep: rng.IntN(2) == 0, PrefetchDepth: rng.IntN(3), NoBandwidthProbe: true}
	probeComms, err := comm.NewLocal(world, comm.LocalOptions{})
	if err != nil {
		t.Fatal(err)
	}
	po := opts
	po.Comm = probeComms[0] // fp16 at world > 1 reduces its overflow check over the ranks
	probe, err := zinf.Open(cfg, model, po)
	if err != nil {
		t.Fatalf("generous pool refused: %v", err)
	}
	minPool := probe.Reservations().MinPoolBytes
	granule := probe.Reservations().GranuleBytes
	probe.Close()
	// Below the minimum (refused), exactly it, between it and twice it,
	// or generous.
	var pool int64
	switch rng.IntN(6) {
	case 0:
		pool = max(minPool-int64(1+rng.IntN(3))*granule, granule)
	case 1:
		pool = minPool
	case 2:
		pool = 4 * minPool
	default:
		pool = minPool + int64(rng.IntN(int(minPool/granule)+1))*granule
	}
	cfg.Zinf.Tiers.CPUPinnedBytes = config.Size(pool)
	faultRate := []float64{0, 0.05, 0.2}[rng.IntN(3)]
	t.Logf("layers %d, tensors %d, world %d, micro %d (loop layer-major %v, zinf.schedule %s), steps %d, dtype %s, pool %d (minimum %d), pipeline %d, serial %v, prefetch %d, fault rate %g, overlap update %v",
		layers, len(model.Tensors), world, micro, layerMajor, cfg.Zinf.Schedule, steps, plan.ParamDType(cfg), pool, minPool, cfg.Zinf.PipelineDepth, opts.SerialStep, opts.PrefetchDepth, faultRate, cfg.Zinf.OverlapUpdate)

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var rts []*zinf.Runtime
	var injs []*faults.Injector
	defer func() {
		for _, rt := range rts {
			rt.Close()
		}
	}()
	comms, err := comm.NewLocal(world, comm.LocalOptions{StallTimeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	for r := range world {
		o := opts
		o.Rank = r
		o.Comm = comms[r]
		inj := faults.New(seed ^ uint64(r+1)*0x9e37)
		o.Faults = inj
		rt, err := zinf.Open(cfg, model, o)
		if err != nil {
			var small *zinf.PoolTooSmallError
			if !errors.As(err, &small) || pool >= minPool {
				t.Fatalf("rank %d: pool %d (minimum %d): %v", r, pool, minPool, err)
			}
			if !strings.Contains(err.Error(), "zinf.tiers.cpu_pinned_bytes") || !strings.Contains(err.Error(), strconv.FormatInt(minPool, 10)) {
				t.Fatalf("the refusal does not name the key and the minimum %d: %v", minPool, err)
			}
			return 0, true // refused up front, as it must be
		}
		rts = append(rts, rt)
		injs = append(injs, inj)
	}
	if pool < minPool {
		t.Fatalf("pool %d below the minimum %d was accepted", pool, minPool)
	}
	if cfg.Zinf.Schedule != config.ScheduleAuto && rts[0].Schedule() != zinf.Schedule(cfg.Zinf.Schedule) {
		t.Fatalf("zinf.schedule %s, the runtime's %s", cfg.Zinf.Schedule, rts[0].Schedule())
	}
	done := make(chan struct{})
	watchdogDone := make(chan struct{})
	go func() {
		defer close(watchdogDone)
		select {
		case <-done:
		case <-time.After(90 * time.Second):
			for r, rt := range rts {
				t.Errorf("watchdog: rank %d pool holders: %s", r, zinf.PoolOf(rt).Holders())
			}
			cancel()
		}
	}()
	defer func() {
		close(done)
		<-watchdogDone
	}()
	tr := &trainRun{t: t, rng: rng, model: model, cfg: cfg, rts: rts, comms: comms, injs: injs, micro: micro, steps: steps, faultRate: faultRate, orders: true,
		layerMajor: layerMajor}
	tr.run(ctx)
	for _, inj := range injs {
		hits += inj.Hits()
	}
	t.Logf("injected faults: %d, retries: %d, steps retried after Step returned: %d", hits, tr.retries.Load(), tr.recovered.Load())
	return hits, false
}

// trainRun trains a model on runtimes of one world through the public API
// and checks every parameter read and, at the end, every optimizer state
// bit for bit against in-memory Adam.
type trainRun struct {
	t     *testing.T
	rng   *rand.Rand // call orders and faults; nil: the README's order, no faults
	model zinf.Model
	cfg   *config.Config
	rts   []*zinf.Runtime
	// comms are the ranks' Options.Comm, when they have one: a rank whose
	// Step fails for good aborts its collectives, so the others stop
	// waiting.
	comms []comm.Comm
	injs  []*faults.Injector // per rank, with rts; nil: no faults
	// micro-steps per step, steps
	micro, steps int
	// faultRate is the chance of arming a fault before an operation that
	// writes (Init, a layer's gradients, Step).
	faultRate float64
	// orders randomizes the call orders the docs allow.
	orders bool
	// layerMajor runs each step layer-major: every micro-batch of a layer
	// while it is begun (BeginLayerMicroBatches), whatever the plan's
	// schedule.
	layerMajor bool
	retries    atomic.Int64
	// recovered counts the steps whose update failed after Step returned
	// (zinf.overlap_update) and were retried.
	recovered atomic.Int64
}

// restartStep is what the loop's helpers panic with when a call reports
// that the last step's update failed after Step returned
// (zinf.ErrUpdateFailed): the step under way starts again once that one
// is retried (trainRun.restartable).
type restartStep struct{ err error }

// updateFailed panics with restartStep when err says the last step's
// update failed after Step returned.
func updateFailed(err error) {
	if errors.Is(err, zinf.ErrUpdateFailed) {
		panic(restartStep{err})
	}
}

// restartable runs body — one step, or the final pass — again after
// retrying on every rank a step whose update failed after Step returned,
// as ErrUpdateFailed's doc says: the fault clears, Step on that rank, then
// the step under way from its first layer.
func (tr *trainRun) restartable(ctx context.Context, body func()) {
	t := tr.t
	for attempt := 0; ; attempt++ {
		var restart *restartStep
		func() {
			defer func() {
				if p := recover(); p != nil {
					rs, ok := p.(restartStep)
					if !ok {
						panic(p)
					}
					restart = &rs
				}
			}()
			body()
		}()
		if restart == nil {
			return
		}
		if !tr.cfg.Zinf.OverlapUpdate || attempt >= 10 {
			t.Fatalf("attempt %d: %v (overlap update %v)", attempt+1, restart.err, tr.cfg.Zinf.OverlapUpdate)
		}
		for r, rt := range tr.rts {
			err := rt.WaitStep(ctx)
			if err == nil {
				continue
			}
			if !errors.Is(err, zinf.ErrUpdateFailed) {
				t.Fatalf("rank %d: wait for the step: %v", r, err)
			}
			if tr.injs != nil {
				tr.injs[r].Clear()
			}
			tr.recovered.Add(1)
			tr.retry(r, "the step that failed after Step returned", func() error { return rt.Step(ctx) })
		}
	}
}

// arm, with probability faultRate (times scale), adds a write fault
// (ENOSPC or EIO, on the path where names or any) to rank r's injector.
func (tr *trainRun) arm(r int, where string, scale float64) {
	if tr.injs == nil || tr.rng == nil || tr.rng.Float64() >= tr.faultRate*scale {
		return
	}
	errno := []syscall.Errno{syscall.ENOSPC, syscall.EIO}[tr.rng.IntN(2)]
	path := []string{where, where, ""}[tr.rng.IntN(3)]
	tr.injs[r].Add(faults.Rule{Kind: faults.Writes, PathContains: path, Nth: 1 + tr.rng.IntN(3), Times: 1 + tr.rng.IntN(2), Err: errno})
}

// retry runs op on rank r; when it fails with an injected fault (ENOSPC or
// EIO after the injector fired), space returns (the injector is cleared)
// and op runs again, as the docs allow for Init, AccumulateGrad and Step;
// a Step that failed because another rank's did (zinf.ErrRankFailed) runs
// again too. Any other error, or a failure that outlives the fault, fails
// the test.
func (tr *trainRun) retry(r int, what string, op func() error) {
	tr.t.Helper()
	if err := tr.retryErr(r, what, op); err != nil {
		updateFailed(err)
		tr.t.Fatal(err)
	}
}

// retryErr is retry that returns the error, for ranks on their own
// goroutines.
func (tr *trainRun) retryErr(r int, what string, op func() error) error {
	for attempt := 0; ; attempt++ {
		err := op()
		if err == nil {
			return nil
		}
		if errors.Is(err, zinf.ErrUpdateFailed) {
			return err
		}
		injected := tr.injs != nil && tr.injs[r].Hits() > 0 && (errors.Is(err, aio.ErrNoSpace) || errors.Is(err, aio.ErrIO))
		if !injected && !errors.Is(err, zinf.ErrRankFailed) || attempt >= 20 {
			return fmt.Errorf("rank %d: %s (attempt %d): %w", r, what, attempt+1, err)
		}
		// Errors must say what failed.
		if injected && !strings.Contains(err.Error(), "tensor") && !strings.Contains(err.Error(), "zinf-") {
			return fmt.Errorf("rank %d: %s: the error names neither a tensor nor a file: %w", r, what, err)
		}
		if injected {
			tr.injs[r].Clear()
		}
		tr.retries.Add(1)
	}
}

// shuffled returns 0..n-1 in a random order (in order without rng).
func (tr *trainRun) shuffled(n int) []int {
	out := make([]int, n)
	for i := range out {
		out[i] = i
	}
	if tr.rng != nil && tr.orders {
		tr.rng.Shuffle(n, func(i, j int) { out[i], out[j] = out[j], out[i] })
	}
	return out
}

func (tr *trainRun) coin() bool { return tr.rng != nil && tr.orders && tr.rng.IntN(2) == 0 }

func (tr *trainRun) run(ctx context.Context) {
	t := tr.t
	t.Helper()
	hyper := plan.Hyper(tr.cfg)
	dtype := plan.ParamDType(tr.cfg)
	L := tr.rts[0].Layers()
	master := map[string][]float32{}
	mom := map[string][]float32{}
	vel := map[string][]float32{}
	descs := tr.model.Tensors
	for _, d := range descs {
		nn, _ := d.Numel()
		v := make([]float32, nn)
		for i := range v {
			v[i] = float32(math.Sin(float64(i)*0.37+float64(len(d.Name)))) * 0.1
		}
		master[d.Name] = v
		mom[d.Name] = make([]float32, nn)
		vel[d.Name] = make([]float32, nn)
	}
	// Metrics from another goroutine, all along (the race detector
	// watches).
	if tr.orders && tr.rng != nil && tr.rng.IntN(2) == 0 {
		stop := make(chan struct{})
		var wg sync.WaitGroup
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				for _, rt := range tr.rts {
					m := rt.Metrics()
					if m.PinnedInUseBytes > m.PinnedBytes {
						t.Errorf("metrics: %d pinned bytes in use of %d", m.PinnedInUseBytes, m.PinnedBytes)
					}
				}
				select {
				case <-stop:
					return
				case <-time.After(time.Millisecond):
				}
			}
		}()
		defer func() {
			close(stop)
			wg.Wait()
		}()
	}
	// Init, in a random tensor order and rank order; about as many faults
	// armed for a model of thousands of tensors as for one of twenty.
	initScale := min(1, 20/float64(len(descs)))
	for _, i := range tr.shuffled(len(descs)) {
		d := descs[i]
		for _, r := range tr.shuffled(len(tr.rts)) {
			tr.arm(r, "", initScale)
			tr.retry(r, "init "+d.Name, func() error { return tr.rts[r].Init(ctx, d.Name, master[d.Name]) })
		}
	}
	grad := func(name string, step, m int, dst []float32) {
		for i := range dst {
			dst[i] = float32(math.Cos(float64(i*7+step*13+m*3+len(name)))) * 0.01
		}
	}
	// pass announces a pass over layers (forward or backward order, or a
	// custom one through Pass) and returns the order.
	pass := func(backward bool) []int {
		order := make([]int, L)
		for l := range order {
			order[l] = l
			if backward {
				order[l] = L - 1 - l
			}
		}
		custom := tr.coin()
		if custom {
			order = tr.shuffled(L)
		}
		for _, rt := range tr.rts {
			switch {
			case custom:
				rt.Pass(order)
			case backward:
				rt.Backward()
			default:
				rt.Forward()
			}
		}
		return order
	}
	readLayer := func(step, l int) {
		for _, name := range tr.rts[0].LayerTensors(l) {
			want := quantize(dtype, master[name])
			if tr.coin() {
				// Raw bytes, in the param dtype (the stored bytes) or
				// converted to another.
				as := []tensor.DType{tensor.Float32, tensor.BFloat16, tensor.Float16, dtype}[tr.rng.IntN(4)]
				got := make([]byte, len(want)*as.Size())
				for r, rt := range tr.rts {
					if err := rt.ReadParamBytes(ctx, name, as, got); err != nil {
						updateFailed(err)
						t.Fatalf("rank %d: read %s as %s: %v", r, name, as, err)
					}
				}
				exp := make([]byte, len(got))
				buffers.Encode(as, exp, want)
				if i := firstDiff(got, exp); i >= 0 {
					t.Fatalf("step %d: %s read as %s differs at byte %d of %d", step, name, as, i, len(got))
				}
				continue
			}
			got := make([]float32, len(want))
			for r, rt := range tr.rts {
				if err := rt.ReadParam(ctx, name, got); err != nil {
					updateFailed(err)
					t.Fatalf("rank %d: read %s: %v", r, name, err)
				}
			}
			for i := range got {
				if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
					t.Fatalf("step %d: %s[%d] = %v, reference %v", step, name, i, got[i], want[i])
				}
			}
		}
	}
	// k is the micro-batches each BeginLayer serves: all of them
	// layer-major, one micro-batch-major.
	k := 1
	if tr.layerMajor {
		k = tr.micro
	}
	begin := func(step, l int, what string) {
		for r, rt := range tr.rts {
			if err := rt.BeginLayerMicroBatches(ctx, l, k); err != nil {
				updateFailed(err)
				t.Fatalf("step %d %s layer %d rank %d: %v", step, what, l, r, err)
			}
		}
	}
	for step := range tr.steps {
		tr.restartable(ctx, func() {
			acc := map[string][]float32{}
			// With fp16 the loop scales its gradients by the loss scale, as a
			// backward pass of a scaled loss would, and the step unscales them.
			scale := float32(tr.rts[0].LossScale())
			// Micro-batch-major: a forward and a backward pass per micro-batch;
			// layer-major: one of each, every micro-batch inside.
			for visit := range tr.micro / k {
				for _, l := range pass(false) {
					begin(step, l, "forward")
					readLayer(step, l)
					for _, rt := range tr.rts {
						rt.EndLayer(l)
					}
				}
				for _, l := range pass(true) {
					begin(step, l, "backward")
					for r := range tr.rts {
						tr.arm(r, "/zinf-grad-", 1)
					}
					m := visit
					for mm := range k {
						if k > 1 {
							m = mm
						}
						for _, name := range tr.rts[0].LayerTensors(l) {
							g := make([]float32, len(master[name]))
							grad(name, step, m, g)
							for i := range g {
								g[i] *= scale
							}
							if a, ok := acc[name]; ok {
								for i := range a {
									a[i] += g[i]
								}
							} else {
								acc[name] = append([]float32(nil), g...)
							}
							for r, rt := range tr.rts {
								tr.retry(r, "accumulate "+name, func() error { return rt.AccumulateGrad(ctx, name, g) })
							}
						}
					}
					for r, rt := range tr.rts {
						if (visit+1)*k == tr.micro && (tr.rng == nil || !tr.orders || tr.rng.IntN(3) != 0) {
							// An error here comes back from Step, which
							// discards the step; it is retried there.
							if err := rt.StepLayer(ctx, l); err != nil && (tr.injs == nil || tr.injs[r].Hits() == 0) {
								updateFailed(err)
								t.Fatalf("step %d: step layer %d rank %d: %v", step, l, r, err)
							}
						}
						rt.EndLayer(l)
					}
				}
				if tr.coin() && tr.coin() {
					// An extra forward pass (evaluation) between micro-steps.
					for _, l := range pass(false) {
						begin(step, l, "eval")
						readLayer(step, l)
						for _, rt := range tr.rts {
							rt.EndLayer(l)
						}
					}
				}
			}
			// The ranks step together, each on its own goroutine: with fp16
			// they reduce the overflow check over the ranks.
			for r := range tr.rts {
				tr.arm(r, []string{"/zinf-optim-", "/zinf-param-"}[tr.rngIntN(2)], 1)
			}
			errs := make([]error, len(tr.rts))
			var wg sync.WaitGroup
			for r, rt := range tr.rts {
				wg.Go(func() {
					errs[r] = tr.retryErr(r, fmt.Sprintf("step %d", step), func() error { return rt.Step(ctx) })
					if errs[r] != nil && tr.comms != nil {
						tr.comms[r].Abort(errs[r]) // the others stop waiting for this rank
					}
				})
			}
			wg.Wait()
			if err := errors.Join(errs...); err != nil {
				t.Fatal(err)
			}
			p := optimizer.StepParams{LR: hyper.LR}
			if scale != 1 {
				p.ScaleGrads, p.GradScale = true, float32(1/float64(scale))
			}
			for name, g := range acc {
				optimizer.AdamStep(master[name], g, mom[name], vel[name], step+1, hyper, p)
			}
		})
	}
	// A final forward pass sees the last step's parameters (with
	// zinf.overlap_update, once each layer's update is published; the last
	// step may fail meanwhile and is retried).
	tr.restartable(ctx, func() {
		for _, l := range pass(false) {
			begin(tr.steps, l, "final")
			readLayer(tr.steps, l)
			for _, rt := range tr.rts {
				rt.EndLayer(l)
			}
		}
	})
	for _, d := range descs {
		for r, rt := range tr.rts {
			lo, hi := rt.Partition(d.Name)
			if lo == hi {
				continue
			}
			ms, m, v, err := rt.ReadOptimizerState(ctx, d.Name)
			if err != nil {
				t.Fatalf("rank %d: read state %s: %v", r, d.Name, err)
			}
			for _, c := range []struct {
				what      string
				got, want []float32
			}{{"master", ms, master[d.Name][lo:hi]}, {"exp_avg", m, mom[d.Name][lo:hi]}, {"exp_avg_sq", v, vel[d.Name][lo:hi]}} {
				for i := range c.want {
					if math.Float32bits(c.got[i]) != math.Float32bits(c.want[i]) {
						t.Fatalf("rank %d %s.%s[%d] = %v, reference %v", r, d.Name, c.what, lo+i, c.got[i], c.want[i])
					}
				}
			}
		}
	}
	for r, rt := range tr.rts {
		if s := rt.Metrics().Steps; s != tr.steps {
			t.Errorf("rank %d: Metrics().Steps = %d, want %d", r, s, tr.steps)
		}
	}
}

func (tr *trainRun) rngIntN(n int) int {
	if tr.rng == nil {
		return 0
	}
	return tr.rng.IntN(n)
}

func firstDiff(a, b []byte) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	if len(a) != len(b) {
		return min(len(a), len(b))
	}
	return -1
}

// quantize rounds fp32 values through the param dtype, as the store keeps
// them.
func quantize(d tensor.DType, v []float32) []float32 {
	b := make([]byte, len(v)*d.Size())
	buffers.Encode(d, b, v)
	out := make([]float32, len(v))
	buffers.Decode(d, out, b)
	return out
}

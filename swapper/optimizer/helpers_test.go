package optimizer_test

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"math"
	"math/rand/v2"
	"runtime"
	"strings"
	"sync"
	"testing"

	"github.com/zinfio/zinf/aio"
	"github.com/zinfio/zinf/buffers"
	"github.com/zinfio/zinf/internal/test/faults"
	"github.com/zinfio/zinf/swapper"
	"github.com/zinfio/zinf/swapper/optimizer"
)

// waitFunc adapts a function to optimizer.Waiter.
type waitFunc func() error

func (f waitFunc) Wait() error { return f() }

// fakeSink is a ParamSink that copies staged values only when their Waiter
// is waited for (as an asynchronous param write would read them), so a
// buffer given back too early shows up as wrong values.
type fakeSink struct {
	mu         sync.Mutex
	staged     map[string][]float32
	committed  map[string][]float32
	stageCalls map[string]int
	commits    int
	discards   int
	stageErr   func(name string) error
	commitErr  error // returned by the next CommitUpdates, then cleared
}

var _ optimizer.ParamSink = (*fakeSink)(nil)

func newFakeSink() *fakeSink {
	return &fakeSink{staged: map[string][]float32{}, committed: map[string][]float32{}, stageCalls: map[string]int{}}
}

func (s *fakeSink) StageUpdate(ctx context.Context, name string, values []float32) (optimizer.Waiter, error) {
	s.mu.Lock()
	hook := s.stageErr
	s.stageCalls[name]++
	s.mu.Unlock()
	if hook != nil {
		if err := hook(name); err != nil {
			return nil, err
		}
	}
	return waitFunc(func() error {
		s.mu.Lock()
		defer s.mu.Unlock()
		s.staged[name] = append([]float32(nil), values...)
		return nil
	}), nil
}

func (s *fakeSink) CommitUpdates() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.commitErr; err != nil {
		s.commitErr = nil
		return err
	}
	for k, v := range s.staged {
		s.committed[k] = v
	}
	s.staged = map[string][]float32{}
	s.stageCalls = map[string]int{}
	s.commits++
	return nil
}

func (s *fakeSink) DiscardUpdates() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.staged = map[string][]float32{}
	s.stageCalls = map[string]int{}
	s.discards++
}

// rangeSink is fakeSink as an optimizer.RangeSink: each range is copied
// when its Waiter is waited for, and the tensor counts as staged once
// every element arrived. Ranges out of order are recorded as errors.
type rangeSink struct {
	*fakeSink
	partial map[string][]float32
	got     map[string]int
	next    map[string]int // the lo the next StageRange must have
	errs    []string
	ranges  int
}

func newRangeSink(s *fakeSink) *rangeSink {
	return &rangeSink{fakeSink: s, partial: map[string][]float32{}, got: map[string]int{}, next: map[string]int{}}
}

func (s *rangeSink) StageRange(ctx context.Context, name string, lo, n int, values []float32) (optimizer.Waiter, error) {
	s.mu.Lock()
	hook := s.stageErr
	s.stageCalls[name]++
	s.ranges++
	if lo != s.next[name] || lo+len(values) > n || len(values) == 0 {
		s.errs = append(s.errs, fmt.Sprintf("%s: range [%d, %d) of %d, want lo %d", name, lo, lo+len(values), n, s.next[name]))
	}
	s.next[name] = (lo + len(values)) % n
	if lo == 0 {
		s.partial[name], s.got[name] = make([]float32, n), 0
	}
	part := s.partial[name]
	s.mu.Unlock()
	if hook != nil {
		if err := hook(name); err != nil {
			return nil, err
		}
	}
	return waitFunc(func() error {
		s.mu.Lock()
		defer s.mu.Unlock()
		copy(part[lo:], values)
		s.got[name] += len(values)
		if s.got[name] == n {
			s.staged[name] = part
		}
		return nil
	}), nil
}

func (s *rangeSink) DiscardUpdates() {
	s.fakeSink.DiscardUpdates()
	s.mu.Lock()
	defer s.mu.Unlock()
	clear(s.next)
}

func (s *rangeSink) rangeErrors() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.errs...)
}

// snapshot returns copies of the committed values.
func (s *fakeSink) snapshot() map[string][]float32 {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := map[string][]float32{}
	for k, v := range s.committed {
		out[k] = append([]float32(nil), v...)
	}
	return out
}

// fakeGrads serves the gradients the test set for the coming step.
type fakeGrads struct {
	mu    sync.Mutex
	g     map[string][]float32
	hook  func(ctx context.Context, name string) error
	reads int
}

var _ optimizer.GradSource = (*fakeGrads)(nil)

func (f *fakeGrads) set(g map[string][]float32) {
	f.mu.Lock()
	f.g = g
	f.mu.Unlock()
}

// fakeSlack is the extra room the fake asks for and the offset it puts
// the values at, as a source reading an aligned span around the range
// would.
const fakeSlack = 64

func (f *fakeGrads) RangeBufferBytes(lo, hi int) int { return 4*(hi-lo) + fakeSlack }

func (f *fakeGrads) ReadRange(ctx context.Context, name string, lo, hi int, dst []byte) ([]float32, error) {
	f.mu.Lock()
	hook := f.hook
	src, ok := f.g[name]
	f.reads++
	f.mu.Unlock()
	if hook != nil {
		if err := hook(ctx, name); err != nil {
			return nil, err
		}
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if !ok || hi > len(src) || lo < 0 || lo > hi {
		return nil, fmt.Errorf("fake grads: no gradient range [%d, %d) for %q", lo, hi, name)
	}
	if len(dst) < f.RangeBufferBytes(lo, hi) {
		return nil, fmt.Errorf("fake grads: %d-byte destination for [%d, %d)", len(dst), lo, hi)
	}
	out := buffers.Float32Bytes(dst[fakeSlack : fakeSlack+4*(hi-lo)])
	copy(out, src[lo:hi])
	return out, nil
}

// spec is one tensor of a test model.
type spec struct {
	name string
	n    int
}

// model is the in-memory reference: plain slices stepped with Adam.
type model struct {
	specs   []spec
	h       optimizer.Hyper
	p, m, v map[string][]float32
	step    int
	seed    uint64
}

func newModel(specs []spec, h optimizer.Hyper, seed uint64) *model {
	md := &model{specs: specs, h: h, seed: seed, p: map[string][]float32{}, m: map[string][]float32{}, v: map[string][]float32{}}
	rng := rand.New(rand.NewPCG(seed, 1))
	for _, s := range specs {
		p := make([]float32, s.n)
		for i := range p {
			p[i] = float32(rng.NormFloat64())
		}
		md.p[s.name], md.m[s.name], md.v[s.name] = p, make([]float32, s.n), make([]float32, s.n)
	}
	return md
}

// grads returns the deterministic gradients of a step (1-based).
func (md *model) grads(step int) map[string][]float32 {
	out := map[string][]float32{}
	for _, s := range md.specs {
		h := fnv.New64a()
		h.Write([]byte(s.name))
		rng := rand.New(rand.NewPCG(md.seed^h.Sum64(), uint64(step)))
		g := make([]float32, s.n)
		for i := range g {
			g[i] = float32(rng.NormFloat64() * 0.1)
			if i%97 == 0 {
				g[i] = 0 // zeros exercise the eps path
			}
		}
		out[s.name] = g
	}
	return out
}

// refStep steps the reference with Adam over whole tensors.
func (md *model) refStep() {
	md.step++
	g := md.grads(md.step)
	for _, s := range md.specs {
		optimizer.Adam(md.p[s.name], g[s.name], md.m[s.name], md.v[s.name], md.step, md.h)
	}
}

func (md *model) elements() int {
	n := 0
	for _, s := range md.specs {
		n += s.n
	}
	return n
}

// rigConfig describes an optimizer under test.
type rigConfig struct {
	backend   string // "" means posix
	checksums bool
	paths     int  // NVMe directories (striping); 0 means 1
	memory    bool // states in pinned memory (no store)
	poolBytes int64
	noParams  bool
	// wholeSink gives the optimizer a plain ParamSink (whole tensors)
	// instead of a RangeSink.
	wholeSink bool
	opts      optimizer.Options // SubGroupSize, PipelineDepth, BufferCount, Hyper
	specs     []spec
	seed      uint64
	// exactPool sizes the pool by optimizer.PinnedNeedBytes for specs
	// (poolBytes is ignored).
	exactPool bool
	// asyncGrads serves the gradients through an AsyncGradSource wrapper
	// of the fake (see asyncGrads).
	asyncGrads bool
	// publish gives the optimizer a RangeSink that is also a Publisher
	// (pubSink).
	publish bool
	// reserve gives the optimizer a region of the pool of its own, of that
	// many bytes (StepTxn.Prefetch reads ahead only there).
	reserve int64
}

// rig is an optimizer with a real store and pool, fake params and grads,
// and the reference model it must match.
type rig struct {
	t     testing.TB
	cfg   rigConfig
	inj   *faults.Injector
	store *swapper.Store
	pool  *buffers.Pool
	sink  *fakeSink
	rsink *rangeSink // nil with wholeSink
	psink *pubSink   // with publish
	grads *fakeGrads
	opt   *optimizer.Optimizer
	md    *model
	async *asyncGrads // with asyncGrads
	// txnOrder, when set, makes step a transaction (BeginStep, Tensor for
	// each name it returns, in order, then Commit) instead of Step.
	txnOrder func() []string
	// prefetch names the tensors a transaction's records are read ahead
	// for (StepTxn.Prefetch) as it opens; prefetched counts the
	// sub-groups Prefetch started reading, over every step.
	prefetch   []string
	prefetched int
}

func newRig(t testing.TB, cfg rigConfig) *rig {
	t.Helper()
	if cfg.backend == "" {
		cfg.backend = aio.BackendPosix
	}
	if err := aio.Available(cfg.backend); err != nil {
		t.Skipf("backend %s: %v", cfg.backend, err)
	}
	if cfg.poolBytes == 0 {
		cfg.poolBytes = 16 << 20
	}
	r := &rig{t: t, cfg: cfg, sink: newFakeSink(), grads: &fakeGrads{}}
	if !cfg.memory {
		r.inj = faults.New(cfg.seed)
		eng, err := aio.New(aio.Options{Backend: cfg.backend, Faults: r.inj})
		if err != nil {
			t.Fatal(err)
		}
		var paths []string
		for range max(cfg.paths, 1) {
			paths = append(paths, t.TempDir())
		}
		st, err := swapper.OpenStore(swapper.StoreOptions{Paths: paths, Engine: eng, Name: "opt",
			Checksums: cfg.checksums, StripeBytes: 8192})
		if err != nil {
			eng.Close()
			t.Fatal(err)
		}
		r.store = st
		t.Cleanup(func() {
			if err := st.Close(); err != nil {
				t.Errorf("store: %v", err)
			}
			if err := eng.Close(); err != nil {
				t.Errorf("engine: %v", err)
			}
		})
	}
	opts := cfg.opts
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	opts.Store, opts.Grads = r.store, r.grads
	if cfg.asyncGrads {
		r.async = &asyncGrads{f: r.grads}
		opts.Grads = r.async
	}
	if !cfg.noParams {
		if cfg.wholeSink {
			opts.Params = r.sink
		} else {
			r.rsink = newRangeSink(r.sink)
			opts.Params = r.rsink
			if cfg.publish {
				r.psink = &pubSink{rangeSink: r.rsink, published: map[string][]float32{}}
				opts.Params = r.psink
			}
		}
	}
	if cfg.exactPool {
		cfg.poolBytes = exactNeed(t, opts, cfg.specs)
		r.cfg.poolBytes = cfg.poolBytes
	}
	popts := buffers.Options{CapacityBytes: cfg.poolBytes, Pin: buffers.PinOff}
	if cfg.reserve > 0 {
		popts.Reservations[buffers.PurposeOptimizer] = cfg.reserve
	}
	pool, err := buffers.NewPool(popts)
	if err != nil {
		t.Fatal(err)
	}
	r.pool = pool
	t.Cleanup(func() {
		if err := pool.Close(); err != nil {
			t.Errorf("pool: %v", err)
		}
	})
	opts.Pool = pool
	opt, err := optimizer.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	r.opt = opt
	t.Cleanup(func() {
		if err := opt.Close(); err != nil && err != optimizer.ErrClosed {
			t.Errorf("optimizer close: %v", err)
		}
	})
	r.md = newModel(cfg.specs, opts.Hyper, cfg.seed)
	for _, s := range cfg.specs {
		if err := opt.Register(s.name, r.md.p[s.name]); err != nil {
			t.Fatal(err)
		}
	}
	return r
}

// exactNeed is optimizer.PinnedNeedBytes for specs with a pool of the
// default granule (a probe pool stands in for the one being sized).
func exactNeed(t testing.TB, opts optimizer.Options, specs []spec) int64 {
	t.Helper()
	probe, err := buffers.NewPool(buffers.Options{CapacityBytes: 1 << 16, Pin: buffers.PinOff})
	if err != nil {
		t.Fatal(err)
	}
	defer probe.Close()
	opts.Pool = probe
	parts := make([]int, len(specs))
	for i, s := range specs {
		parts[i] = s.n
	}
	return optimizer.PinnedNeedBytes(opts, parts, nil)
}

// step gives the optimizer the gradients of its next step and runs it.
func (r *rig) step(ctx context.Context) error {
	r.grads.set(r.md.grads(r.opt.StepCount() + 1))
	if r.txnOrder != nil {
		return r.txnStep(ctx, r.txnOrder())
	}
	return r.opt.Step(ctx)
}

// txnStep takes the step as a transaction, handing the named tensors over
// as a backward pass would, and commits. A hand-over that reports the
// step's background failure ends the hand-overs; Commit returns it.
func (r *rig) txnStep(ctx context.Context, order []string) error {
	r.t.Helper()
	txn, err := r.opt.BeginStep(ctx)
	if err != nil {
		return err
	}
	for _, name := range r.prefetch {
		n, err := txn.Prefetch(name)
		if err != nil {
			r.t.Errorf("Prefetch(%s): %v", name, err)
		}
		r.prefetched += n
	}
	for _, name := range order {
		if err := txn.Tensor(name); err != nil {
			var oe *optimizer.Error
			if errors.As(err, &oe) && oe.Op == "hand-over" {
				r.t.Errorf("Tensor(%s) refused: %v", name, err)
				txn.Abort()
				return err
			}
			break
		}
		runtime.Gosched() // the backward pass of the next layer
	}
	return txn.Commit(ctx)
}

// mustStep steps both the optimizer and the reference.
func (r *rig) mustStep() {
	r.t.Helper()
	if err := r.step(context.Background()); err != nil {
		r.t.Fatalf("step %d: %v", r.opt.StepCount()+1, err)
	}
	r.md.refStep()
}

type state struct{ p, m, v []float32 }

func (r *rig) states() map[string]state {
	r.t.Helper()
	out := map[string]state{}
	for _, s := range r.cfg.specs {
		p, m, v, err := r.opt.ReadState(context.Background(), s.name)
		if err != nil {
			r.t.Fatalf("ReadState(%s): %v", s.name, err)
		}
		out[s.name] = state{p, m, v}
	}
	return out
}

// check compares the optimizer's states, step count and committed params
// with the reference, bit for bit.
func (r *rig) check(label string) {
	r.t.Helper()
	if got := r.opt.StepCount(); got != r.md.step {
		r.t.Fatalf("%s: StepCount = %d, want %d", label, got, r.md.step)
	}
	committed := r.sink.snapshot()
	for name, st := range r.states() {
		for _, c := range []struct {
			what      string
			got, want []float32
		}{{"master", st.p, r.md.p[name]}, {"exp_avg", st.m, r.md.m[name]}, {"exp_avg_sq", st.v, r.md.v[name]}} {
			if i := firstDiff(c.got, c.want); i >= 0 {
				r.t.Fatalf("%s: %s of %s differs at %d: got %v (%08x), want %v (%08x)", label, c.what, name, i,
					at(c.got, i), bits(c.got, i), at(c.want, i), bits(c.want, i))
			}
		}
		if r.md.step > 0 && !r.cfg.noParams && len(r.md.p[name]) > 0 {
			if i := firstDiff(committed[name], r.md.p[name]); i >= 0 {
				r.t.Fatalf("%s: committed param %s differs at %d", label, name, i)
			}
		}
	}
	if r.rsink != nil {
		if errs := r.rsink.rangeErrors(); len(errs) > 0 {
			r.t.Fatalf("%s: ranges staged out of order: %v", label, errs)
		}
	}
	r.checkStoreClean(label)
}

// checkStoreClean asserts no staged or backup records are left and no
// optimizer buffer is held between steps.
func (r *rig) checkStoreClean(label string) {
	r.t.Helper()
	if r.store != nil {
		for _, n := range r.store.Names() {
			if strings.Contains(n, "~") {
				r.t.Fatalf("%s: store still holds %q", label, n)
			}
		}
		if n := len(r.store.Names()); n != r.subGroups() {
			r.t.Fatalf("%s: store holds %d records, want %d", label, n, r.subGroups())
		}
	}
	want := int64(0)
	if r.cfg.memory {
		want = 2 * int64(r.subGroups())
	}
	if got := r.pool.Stats().Outstanding; got != want {
		r.t.Fatalf("%s: %d pool buffers outstanding between steps, want %d", label, got, want)
	}
}

func (r *rig) subGroups() int {
	n := 0
	sgs := r.opt.Options().SubGroupSize
	for _, s := range r.cfg.specs {
		n += (s.n + sgs - 1) / sgs
	}
	return n
}

func firstDiff(a, b []float32) int {
	if len(a) != len(b) {
		return 0
	}
	for i := range a {
		if math.Float32bits(a[i]) != math.Float32bits(b[i]) {
			return i
		}
	}
	return -1
}

func at(s []float32, i int) float32 {
	if i < len(s) {
		return s[i]
	}
	return float32(math.NaN())
}

func bits(s []float32, i int) uint32 { return math.Float32bits(at(s, i)) }

// equalStates reports whether two snapshots are bitwise equal.
func equalStates(a, b map[string]state) bool {
	if len(a) != len(b) {
		return false
	}
	for k, x := range a {
		y, ok := b[k]
		if !ok || firstDiff(x.p, y.p) >= 0 || firstDiff(x.m, y.m) >= 0 || firstDiff(x.v, y.v) >= 0 {
			return false
		}
	}
	return true
}

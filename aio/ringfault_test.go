package aio

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/zinfio/zinf/internal/test/testenv"
)

// This file is the ring-level fault seam: faultRing wraps a backend's real
// ring (through newEngineWrapped) and makes it misbehave the way a kernel
// ring can, so the tests can check that the engine core still completes
// every request and that Close returns.

// ringFault is one kind of misbehaviour.
type ringFault int

const (
	// faultOverflow withholds completions from a wait and reports them
	// lost, as io_uring does when its CQ overflows beyond what it can keep.
	faultOverflow ringFault = iota
	// faultStray adds a completion for a token not in flight to a wait's
	// results, and reports it as the rings do.
	faultStray
	// faultWaitError returns valid completions together with a fatal error.
	faultWaitError
	// faultSubmitError refuses a submission (none of the batch accepted).
	faultSubmitError
)

func (f ringFault) String() string {
	return [...]string{"overflow", "stray", "wait-error", "submit-error"}[f]
}

// faultPlan says when a fault fires; it is shared by every ring of an
// engine (replacement rings included) and fires once.
type faultPlan struct {
	kind ringFault
	// at is the 1-based ordinal of the eligible call it fires on.
	at int
	// drained, for faultWaitError, makes the fault fire only on a wait
	// that returns the ring's last operations in flight, so the test can
	// tell that those completions were delivered.
	drained bool

	mu       sync.Mutex
	eligible int
	fired    int
	withheld int // completions withheld by faultOverflow
	// rings counts the rings made (replacements included); registered
	// the registerBuffers calls with memory that a ring took.
	rings, registered int
}

func (p *faultPlan) fire() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.fired > 0 {
		return false
	}
	p.eligible++
	if p.eligible < p.at {
		return false
	}
	p.fired++
	return true
}

func (p *faultPlan) firedCount() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.fired
}

type heldPrep struct {
	op    Op
	t     target
	buf   []byte
	off   int64
	token uint32
}

// faultRing is a ring that forwards to inner and injects plan's fault.
// Preps are held until submit so that a refused submission can withdraw
// them, as the ring contract requires.
type faultRing struct {
	inner    ring
	backend  string
	plan     *faultPlan
	held     []heldPrep
	inflight map[uint32]bool // tokens handed to inner and not yet returned
	carry    []completion    // real completions held back for the next wait
}

var _ ring = (*faultRing)(nil)

func (r *faultRing) prep(op Op, t target, buf []byte, off int64, token uint32) {
	r.held = append(r.held, heldPrep{op, t, buf, off, token})
}

func (r *faultRing) fixedBuffer(buf []byte) bool { return r.inner.fixedBuffer(buf) }
func (r *faultRing) registerBuffers(regions [][]byte) error {
	err := r.inner.registerBuffers(regions)
	if err == nil && len(regions) > 0 {
		r.plan.mu.Lock()
		r.plan.registered++
		r.plan.mu.Unlock()
	}
	return err
}
func (r *faultRing) registerFile(fd int) (int32, error) { return r.inner.registerFile(fd) }
func (r *faultRing) unregisterFile(slot int32) error    { return r.inner.unregisterFile(slot) }

func (r *faultRing) forward() {
	for _, h := range r.held {
		r.inner.prep(h.op, h.t, h.buf, h.off, h.token)
		r.inflight[h.token] = true
	}
	r.held = r.held[:0]
}

func (r *faultRing) submit() error {
	if len(r.held) > 0 && r.plan.kind == faultSubmitError && r.plan.fire() {
		r.held = r.held[:0]
		return errors.New("injected submit failure")
	}
	r.forward()
	return r.inner.submit()
}

func (r *faultRing) wait(min int, out []completion) (int, error) {
	if len(r.held) > 0 {
		r.forward()
		if err := r.inner.submit(); err != nil {
			return 0, err
		}
	}
	if len(r.carry) > 0 {
		n := copy(out, r.carry)
		r.carry = r.carry[:copy(r.carry, r.carry[n:])]
		return n, nil
	}
	n, err := r.inner.wait(min, out)
	defer func() {
		// What the core is told about is no longer in flight; carried
		// completions are, until delivered.
		for _, c := range out[:n] {
			delete(r.inflight, c.token)
		}
	}()
	if n == 0 || err != nil {
		return n, err
	}
	switch r.plan.kind {
	case faultOverflow:
		if r.plan.fire() {
			// The withheld operations finished in the inner ring; the
			// core never hears of them.
			k := max(1, n/2)
			r.plan.mu.Lock()
			r.plan.withheld += k
			r.plan.mu.Unlock()
			for _, c := range out[n-k : n] {
				delete(r.inflight, c.token)
			}
			n -= k
			return n, &lostError{backend: r.backend, n: k}
		}
	case faultStray:
		if r.plan.fire() {
			if n == len(out) {
				// No room: hold the last real completion for the next wait.
				n--
				r.carry = append(r.carry, out[n])
			}
			// One in-range token that is not in flight, when there is one,
			// else one out of range.
			tok := uint32(r.capacity() + 7)
			for t := range uint32(r.capacity()) {
				if !r.inflight[t] {
					tok = t
					break
				}
			}
			out[n] = completion{token: tok, res: 4096}
			n++
			return n, &strayError{backend: r.backend, token: uint64(r.capacity() + 9)}
		}
	case faultWaitError:
		if (!r.plan.drained || len(r.inflight) == n) && r.plan.fire() {
			return n, errors.New("injected ring failure")
		}
	}
	return n, nil
}

func (r *faultRing) capacity() int { return r.inner.capacity() }
func (r *faultRing) close() error  { return r.inner.close() }

// ringTestBackends are the backends to run the ring-fault tests on:
// every one available, and a failure for one ZINF_REQUIRE_BACKENDS lists
// that is not.
func ringTestBackends(t *testing.T) []string {
	return testenv.Backends(t, Backends, Available)
}

// watchdog runs f and fails the test, with every goroutine's stack, if it
// has not returned within d.
func watchdog(t *testing.T, what string, d time.Duration, f func()) {
	t.Helper()
	done := make(chan struct{})
	go func() {
		defer close(done)
		f()
	}()
	select {
	case <-done:
	case <-time.After(d):
		buf := make([]byte, 1<<20)
		buf = buf[:runtime.Stack(buf, true)]
		t.Fatalf("%s did not return within %v; goroutines:\n%s", what, d, buf)
	}
}

const ringFaultTimeout = 20 * time.Second

type faultRun struct {
	e     *engine
	f     *File
	data  []byte
	plan  *faultPlan
	reqSz int
	// arena is memory registered with the engine; waves read half their
	// requests into it (registered buffers on io_uring), half into the Go
	// heap.
	arena []byte
}

// newFaultRun builds an engine whose rings are wrapped with plan, over a
// file holding data.
func newFaultRun(t *testing.T, backend string, plan *faultPlan, par, qd int) *faultRun {
	t.Helper()
	opts := Options{Backend: backend, BlockSizeBytes: 16 << 10, QueueDepth: qd, IntraOpParallelism: par,
		Direct: DirectOff, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
	opts.EnsureDefaults()
	e, err := newEngineWrapped(opts, backend, func(_ int, r ring) ring {
		plan.mu.Lock()
		plan.rings++
		plan.mu.Unlock()
		return &faultRing{inner: r, backend: backend, plan: plan, inflight: map[uint32]bool{}}
	})
	if err != nil {
		t.Fatalf("newEngineWrapped(%s): %v", backend, err)
	}
	closed := false
	t.Cleanup(func() {
		if !closed {
			watchdog(t, "Engine.Close at cleanup", ringFaultTimeout, func() { e.Close() })
		}
	})
	data := make([]byte, 2<<20)
	for i := range data {
		data[i] = byte(i*7 + i>>11)
	}
	path := filepath.Join(t.TempDir(), "data")
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
	f, err := e.Open(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	r := &faultRun{e: e, f: f, data: data, plan: plan, reqSz: 64 << 10, arena: make([]byte, 2<<20)}
	if err := e.RegisterMemory(r.arena); (err == nil) != (backend == BackendUring) {
		t.Fatalf("%s: RegisterMemory: %v", backend, err)
	}
	t.Cleanup(func() { closed = true })
	return r
}

// registeredRings reports how many rings took the arena, and how many
// rings there have been.
func (r *faultRun) registeredRings() (registered, rings int) {
	r.plan.mu.Lock()
	defer r.plan.mu.Unlock()
	return r.plan.registered, r.plan.rings
}

// wave reads count requests of reqSz bytes at distinct offsets, all in
// flight together, waits for each under the watchdog and returns their
// errors; a request that succeeds must have read the file's bytes.
func (r *faultRun) wave(t *testing.T, count int) []error {
	t.Helper()
	reqs := make([]Request, count)
	for i := range reqs {
		off := int64(i*r.reqSz) % int64(len(r.data))
		buf := make([]byte, r.reqSz)
		if lo := i / 2 * r.reqSz; i%2 == 0 && lo+r.reqSz <= len(r.arena) {
			buf = r.arena[lo : lo+r.reqSz]
		}
		reqs[i] = Request{Op: OpRead, File: r.f, Offset: off, Buf: buf}
		if err := r.e.Submit(&reqs[i]); err != nil {
			t.Fatalf("submit %d: %v", i, err)
		}
	}
	errs := make([]error, count)
	watchdog(t, fmt.Sprintf("Wait on %d requests", count), ringFaultTimeout, func() {
		for i := range reqs {
			n, err := reqs[i].Wait()
			errs[i] = err
			if err == nil {
				want := r.data[reqs[i].Offset : reqs[i].Offset+int64(r.reqSz)]
				if n != int64(r.reqSz) || !bytes.Equal(reqs[i].Buf, want) {
					t.Errorf("request %d succeeded but moved %d bytes, data equal %v", i, n, bytes.Equal(reqs[i].Buf, want))
				}
			}
		}
	})
	return errs
}

func (r *faultRun) close(t *testing.T) {
	t.Helper()
	watchdog(t, "Engine.Close", ringFaultTimeout, func() {
		if err := r.e.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
}

// checkRingErr checks that err is a clear ring failure: an *OpError
// matching ErrRingFailed that names the backend, the ring and want.
func checkRingErr(t *testing.T, backend string, err error, want string) {
	t.Helper()
	var oe *OpError
	msg := err.Error()
	if !errors.Is(err, ErrRingFailed) || !errors.As(err, &oe) || !strings.Contains(msg, backend+" ring ") || !strings.Contains(msg, want) {
		t.Errorf("error %q: want an *OpError matching ErrRingFailed naming %q, the ring and %q", msg, backend, want)
	}
}

func count(errs []error) (failed int) {
	for _, err := range errs {
		if err != nil {
			failed++
		}
	}
	return failed
}

// TestRingFaultOverflow: completions lost to a CQ overflow fail exactly
// their requests with ErrCompletionLost; the ring is replaced and the
// engine keeps working.
func TestRingFaultOverflow(t *testing.T) {
	for _, backend := range ringTestBackends(t) {
		t.Run(backend, func(t *testing.T) {
			plan := &faultPlan{kind: faultOverflow, at: 3}
			r := newFaultRun(t, backend, plan, 2, 8)
			errs := r.wave(t, 24)
			if plan.firedCount() != 1 {
				t.Fatalf("the overflow fired %d times, want 1", plan.firedCount())
			}
			failed := count(errs)
			if failed == 0 || failed > plan.withheld {
				t.Fatalf("%d requests failed after %d completions were lost; want 1 to %d", failed, plan.withheld, plan.withheld)
			}
			for _, err := range errs {
				if err != nil {
					checkRingErr(t, backend, err, "CQ overflow")
					if !errors.Is(err, ErrCompletionLost) {
						t.Errorf("error %q does not match ErrCompletionLost", err)
					}
				}
			}
			if st := r.e.Stats(); st.RingFailures < 1 || st.Errors != int64(failed) {
				t.Errorf("stats %+v: want RingFailures >= 1 and Errors = %d", st, failed)
			}
			fixed := r.e.Stats().FixedBufferPieces
			if again := r.wave(t, 24); count(again) != 0 {
				t.Fatalf("after recovery %d of 24 requests failed; first: %v", count(again), errors.Join(again...))
			}
			// The replacement ring registered the arena again, and the wave
			// after recovery used it.
			if backend == BackendUring {
				reg, rings := r.registeredRings()
				if rings < 3 || reg != rings {
					t.Errorf("%d rings (a replacement among them), %d took the registered memory; want all", rings, reg)
				}
				if st := r.e.Stats(); st.FixedBufferPieces <= fixed {
					t.Errorf("no registered-buffer pieces after recovery (%d before, %d after)", fixed, st.FixedBufferPieces)
				}
			}
			r.close(t)
		})
	}
}

// TestRingFaultStray: a stray completion is counted and ignored; every
// request still succeeds with the right bytes.
func TestRingFaultStray(t *testing.T) {
	for _, backend := range ringTestBackends(t) {
		t.Run(backend, func(t *testing.T) {
			plan := &faultPlan{kind: faultStray, at: 2}
			r := newFaultRun(t, backend, plan, 2, 8)
			errs := r.wave(t, 24)
			if plan.firedCount() != 1 {
				t.Fatalf("the stray fired %d times, want 1", plan.firedCount())
			}
			if n := count(errs); n != 0 {
				t.Fatalf("%d requests failed after a stray completion: %v", n, errors.Join(errs...))
			}
			// One stray completion in the results, one reported as an error.
			if st := r.e.Stats(); st.StrayCompletions != 2 || st.Errors != 0 {
				t.Errorf("stats %+v: want StrayCompletions 2 and no errors", st)
			}
			r.close(t)
		})
	}
}

// TestRingFaultWaitErrorDelivers: a fatal error returned together with the
// ring's last completions still delivers them (the request succeeds); the
// ring is then out of service and later requests fail with a clear error.
func TestRingFaultWaitErrorDelivers(t *testing.T) {
	for _, backend := range ringTestBackends(t) {
		t.Run(backend, func(t *testing.T) {
			plan := &faultPlan{kind: faultWaitError, at: 1, drained: true}
			r := newFaultRun(t, backend, plan, 1, 8)
			if errs := r.wave(t, 1); errs[0] != nil {
				t.Fatalf("the request whose completions came with the ring error failed: %v", errs[0])
			}
			if plan.firedCount() != 1 {
				t.Fatalf("the wait error fired %d times, want 1", plan.firedCount())
			}
			errs := r.wave(t, 4)
			for _, err := range errs {
				if err == nil {
					t.Fatal("a request on a failed ring succeeded")
				}
				checkRingErr(t, backend, err, "injected ring failure")
			}
			r.close(t)
		})
	}
}

// TestRingFaultWaitErrorMidFlight: a fatal error while many operations are
// in flight fails every request that was waiting on the ring, and Close
// returns.
func TestRingFaultWaitErrorMidFlight(t *testing.T) {
	for _, backend := range ringTestBackends(t) {
		t.Run(backend, func(t *testing.T) {
			plan := &faultPlan{kind: faultWaitError, at: 2}
			r := newFaultRun(t, backend, plan, 2, 4)
			errs := r.wave(t, 24)
			if plan.firedCount() != 1 {
				t.Fatalf("the wait error fired %d times, want 1", plan.firedCount())
			}
			if count(errs) == 0 {
				t.Fatal("no request failed after the ring failed mid-flight")
			}
			for _, err := range errs {
				if err != nil {
					checkRingErr(t, backend, err, "injected ring failure")
				}
			}
			if st := r.e.Stats(); st.RingFailures != 1 {
				t.Errorf("stats %+v: want RingFailures 1", st)
			}
			r.close(t)
		})
	}
}

// TestRingFaultSubmitError: a refused submission fails the requests of that
// batch with a clear error; the ring stays in service.
func TestRingFaultSubmitError(t *testing.T) {
	for _, backend := range ringTestBackends(t) {
		t.Run(backend, func(t *testing.T) {
			plan := &faultPlan{kind: faultSubmitError, at: 2}
			r := newFaultRun(t, backend, plan, 2, 8)
			errs := r.wave(t, 24)
			if plan.firedCount() != 1 {
				t.Fatalf("the submit error fired %d times, want 1", plan.firedCount())
			}
			if count(errs) == 0 {
				t.Fatal("no request failed after a refused submission")
			}
			for _, err := range errs {
				if err != nil {
					checkRingErr(t, backend, err, "injected submit failure")
				}
			}
			if again := r.wave(t, 24); count(again) != 0 {
				t.Fatalf("after a refused submission %d of 24 later requests failed; first: %v", count(again), errors.Join(again...))
			}
			r.close(t)
		})
	}
}

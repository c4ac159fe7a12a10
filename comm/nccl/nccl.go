package nccl

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"sync"
	"time"
	"unsafe"

	"github.com/zinfio/zinf/accel"
	"github.com/zinfio/zinf/accel/cuda"
	"github.com/zinfio/zinf/comm"
)

// DefaultLibrary is NCCL's soname.
const DefaultLibrary = "libnccl.so.2"

// LibraryEnv names the environment variable that overrides DefaultLibrary.
const LibraryEnv = "ZINF_NCCL_LIBRARY"

// minVersion is the oldest NCCL with ncclSend and ncclRecv (2.7.0).
const minVersion = 2700

// Options configure New. Zero values take the defaults.
type Options struct {
	// Library is the NCCL library to load. Default: $ZINF_NCCL_LIBRARY,
	// else DefaultLibrary.
	Library string
	// StallTimeout bounds how long a collective may run before the
	// communicator is aborted with comm.ErrStalled. Default
	// comm.DefaultStallTimeout; negative: no bound.
	StallTimeout time.Duration
	// NativeReductions uses ncclReduceScatter and ncclAllReduce: NCCL's
	// order of addition (a ring or a tree), so results are NOT bit-exact
	// and differ from the in-process world's rank-ordered sums in the last
	// bits. Default false: rank-ordered and bit-exact (see the package
	// documentation for the price).
	NativeReductions bool
	// Poll is the longest sleep between two looks at a collective in
	// flight. Default 200 µs.
	Poll time.Duration
}

func (o *Options) fill() {
	if o.Library == "" {
		o.Library = os.Getenv(LibraryEnv)
	}
	if o.Library == "" {
		o.Library = DefaultLibrary
	}
	if o.StallTimeout == 0 {
		o.StallTimeout = comm.DefaultStallTimeout
	}
	if o.Poll <= 0 {
		o.Poll = 200 * time.Microsecond
	}
}

// Error is a failed NCCL call.
type Error struct {
	Call string
	Code int    // ncclResult_t
	Msg  string // ncclGetErrorString
}

func (e *Error) Error() string {
	return fmt.Sprintf("nccl: %s: %s (ncclResult_t %d)", e.Call, e.Msg, e.Code)
}

// ncclResult_t codes (nccl.h).
const (
	resultSuccess      = 0
	resultInvalidUsage = 5
	resultRemoteError  = 6
	resultInProgress   = 7
	ncclUint8          = 1
	ncclFloat32        = 7
	ncclFloat64        = 8
	ncclSum            = 0
	ncclMax            = 2
	uniqueIDBytes      = 128
)

// Comm is one rank's NCCL communicator over device memory of one CUDA
// device. Its collectives take accel.Mem buffers of that device; counts
// are per rank, like comm.Comm's. One goroutine at a time uses it; Abort
// may be called from any goroutine. Close it before the device.
type Comm struct {
	opts       Options
	boot       comm.Comm
	dev        *cuda.Device
	lib        library
	rank, size int
	h          uintptr // ncclComm_t
	stream     accel.Stream
	sh         uintptr // its CUstream

	calls chan func()
	done  chan struct{}

	mu       sync.Mutex
	failed   *comm.RankError
	abortErr error
	closed   bool
	hAborted bool // ncclCommAbort was called: the handle is gone

	scratch accel.Mem // device: the chunks of a rank-ordered reduction
}

// New builds rank boot.Rank()'s communicator of a world of boot.Size()
// ranks, each on its own GPU (dev): rank 0 makes NCCL's unique id and
// boot broadcasts it; every rank must call New. It fails with an error
// matching accel.ErrUnavailable, saying what is missing, when NCCL cannot
// be loaded.
func New(boot comm.Comm, dev *cuda.Device, opts Options) (*Comm, error) {
	if boot == nil || dev == nil {
		return nil, errors.New("nccl: New needs the bootstrap comm.Comm and the rank's *cuda.Device")
	}
	opts.fill()
	lib, err := load(opts.Library)
	if err != nil {
		return nil, err
	}
	ver, err := lib.version()
	if err != nil {
		return nil, err
	}
	if ver < minVersion {
		return nil, fmt.Errorf("nccl: %s is NCCL %d.%d.%d; zinf needs 2.7 or later (ncclSend/ncclRecv): %w", opts.Library, ver/10000, ver/100%100, ver%100, accel.ErrUnavailable)
	}
	c := &Comm{opts: opts, boot: boot, dev: dev, lib: lib, rank: boot.Rank(), size: boot.Size(), calls: make(chan func()), done: make(chan struct{})}
	ready := make(chan error, 1)
	go func() {
		defer close(c.done)
		// The worker lives on one locked thread with the device's context
		// current, for every NCCL and CUDA call of this communicator.
		err := dev.WithContext(func() error {
			ready <- nil
			for f := range c.calls {
				f()
			}
			return nil
		})
		if err != nil {
			ready <- err
		}
	}()
	if err := <-ready; err != nil {
		return nil, err
	}
	ctx := context.Background()
	id := make([]byte, uniqueIDBytes)
	var initErr error
	if c.rank == 0 {
		initErr = c.run(func() error { return lib.uniqueID(id) })
	}
	// Rank 0's failure must not leave the others waiting for the id.
	flag := []float64{0}
	if initErr != nil {
		flag[0] = 1
	}
	if err := boot.AllReduceFloat64(ctx, flag, comm.Max); err != nil {
		c.stop()
		return nil, fmt.Errorf("nccl: agreeing on the unique id: %w", err)
	}
	if initErr != nil || flag[0] != 0 {
		c.stop()
		if initErr == nil {
			initErr = errors.New("rank 0 could not make NCCL's unique id")
		}
		return nil, fmt.Errorf("nccl: ncclGetUniqueId: %w", initErr)
	}
	if err := boot.Broadcast(ctx, id, 0); err != nil {
		c.stop()
		return nil, fmt.Errorf("nccl: broadcasting the unique id: %w", err)
	}
	err = c.run(func() error {
		st, err := dev.NewStream()
		if err != nil {
			return err
		}
		c.stream = st
		if c.sh, err = dev.Handle(st); err != nil {
			return err
		}
		c.h, err = lib.initRank(c.size, id, c.rank)
		return err
	})
	if err != nil {
		if c.stream != nil {
			c.stream.Close()
		}
		c.stop()
		return nil, fmt.Errorf("nccl: rank %d of %d: %w", c.rank, c.size, err)
	}
	return c, nil
}

// run runs f on the worker and waits for it.
func (c *Comm) run(f func() error) error {
	errc := make(chan error, 1)
	select {
	case c.calls <- func() { errc <- f() }:
	case <-c.done:
		return &comm.RankError{Rank: c.rank, Op: "nccl", Err: comm.ErrClosed}
	}
	return <-errc
}

func (c *Comm) stop() {
	close(c.calls)
	<-c.done
}

// Rank is this rank's index.
func (c *Comm) Rank() int { return c.rank }

// Size is the number of ranks.
func (c *Comm) Size() int { return c.size }

func (c *Comm) refuse(op string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	switch {
	case c.closed:
		return &comm.RankError{Rank: c.rank, Op: op, Err: comm.ErrClosed}
	case c.failed != nil:
		return c.failed
	}
	return nil
}

func (c *Comm) fail(e *comm.RankError) *comm.RankError {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.failed == nil {
		c.failed = e
	}
	return c.failed
}

// collective runs issue (the NCCL calls queuing one collective on the
// stream) on the worker and polls the stream until the work is done, or
// NCCL reports an asynchronous error, or ctx ends, or the stall timeout
// passes, or Abort is called: then the communicator is aborted, the
// bootstrap Comm too, and the failure is returned from now on.
func (c *Comm) collective(ctx context.Context, op string, issue func() error) error {
	if err := c.refuse(op); err != nil {
		return err
	}
	return c.run(func() error {
		if err := ctx.Err(); err != nil {
			return c.abort(&comm.RankError{Rank: c.rank, Op: op, Err: err})
		}
		if err := issue(); err != nil {
			return c.abort(&comm.RankError{Rank: -1, Op: op, Err: err})
		}
		t0 := time.Now()
		sleep := time.Duration(0)
		for {
			// NCCL's asynchronous error first: a collective that "finished"
			// on a communicator with a network or peer failure did not.
			if code, err := c.lib.asyncError(c.h); err != nil || (code != resultSuccess && code != resultInProgress) {
				if err == nil {
					err = c.lib.errorOf("ncclCommGetAsyncError", code)
				}
				return c.abort(&comm.RankError{Rank: -1, Op: op, Err: err})
			}
			done, err := c.dev.Done(c.stream)
			if err != nil {
				return c.abort(&comm.RankError{Rank: -1, Op: op, Err: err})
			}
			if done {
				return nil
			}
			c.mu.Lock()
			aborted := c.abortErr
			c.mu.Unlock()
			switch {
			case aborted != nil:
				return c.abort(&comm.RankError{Rank: c.rank, Op: "abort", Err: aborted})
			case ctx.Err() != nil:
				return c.abort(&comm.RankError{Rank: c.rank, Op: op, Err: ctx.Err()})
			case c.opts.StallTimeout > 0 && time.Since(t0) > c.opts.StallTimeout:
				return c.abort(&comm.RankError{Rank: -1, Op: op, Err: fmt.Errorf("%w: rank %d waited %v", comm.ErrStalled, c.rank, c.opts.StallTimeout)})
			}
			sleep = min(max(2*sleep, time.Microsecond), c.opts.Poll)
			time.Sleep(sleep)
		}
	})
}

// abort ends the communicator and records e.
func (c *Comm) abort(e *comm.RankError) error {
	f := c.fail(e)
	c.abortComm()
	c.boot.Abort(f)
	return f
}

// abortComm calls ncclCommAbort once (from any goroutine: it is how NCCL
// ends work that waits for a peer that will not come).
func (c *Comm) abortComm() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.h != 0 && !c.hAborted {
		c.hAborted = true
		c.lib.commAbort(c.h)
	}
}

// Abort ends the world: the communicator is aborted (ncclCommAbort,
// which ends a collective in flight), this rank's later calls fail, and
// the bootstrap Comm is aborted so the other ranks learn of it. It may be
// called from any goroutine.
func (c *Comm) Abort(err error) {
	if err == nil {
		err = comm.ErrAborted
	}
	c.mu.Lock()
	if c.abortErr == nil {
		c.abortErr = err
	}
	c.mu.Unlock()
	c.fail(&comm.RankError{Rank: c.rank, Op: "abort", Err: err})
	c.abortComm()
	c.boot.Abort(err)
}

// Close destroys the communicator (ncclCommDestroy; ncclCommAbort after
// a failure) and its stream and scratch memory. It is idempotent. The
// bootstrap Comm is the caller's.
func (c *Comm) Close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	c.closed = true
	c.mu.Unlock()
	err := c.run(func() error {
		var errs []error
		c.mu.Lock()
		if c.h != 0 && !c.hAborted {
			errs = append(errs, c.lib.commDestroy(c.h))
		}
		c.h = 0
		c.mu.Unlock()
		if c.scratch != nil {
			errs = append(errs, c.dev.Free(c.scratch))
		}
		if c.stream != nil {
			errs = append(errs, c.stream.Close())
		}
		return errors.Join(errs...)
	})
	c.stop()
	return err
}

// ptr is m's device address plus off, checked to hold n bytes.
func (c *Comm) ptr(m accel.Mem, off, n int64, what string) (uintptr, error) {
	if m == nil {
		if n == 0 {
			return 0, nil
		}
		return 0, fmt.Errorf("nccl: %s: no buffer for %d bytes", what, n)
	}
	if off < 0 || n < 0 || off+n > m.Size() {
		return 0, fmt.Errorf("nccl: %s: bytes [%d, %d) of a buffer of %d", what, off, off+n, m.Size())
	}
	p, err := c.dev.Pointer(m)
	return p + uintptr(off), err
}

func checkCounts(op string, counts []int64, size int) (off []int64, total int64, equal bool, err error) {
	if len(counts) != size {
		return nil, 0, false, fmt.Errorf("nccl: %s: %d counts for a world of %d ranks", op, len(counts), size)
	}
	off = make([]int64, size)
	equal = true
	for r, n := range counts {
		if n < 0 {
			return nil, 0, false, fmt.Errorf("nccl: %s: counts[%d] = %d: must be >= 0", op, r, n)
		}
		off[r] = total
		total += n
		equal = equal && n == counts[0]
	}
	return off, total, equal, nil
}

// AllGather gives every rank every rank's chunk, in rank order: rank r's
// send holds counts[r] bytes, recv receives sum(counts), rank r's at
// offset sum(counts[:r]). Equal chunks go through ncclAllGather, unequal
// ones through grouped ncclSend/ncclRecv.
func (c *Comm) AllGather(ctx context.Context, send, recv accel.Mem, counts []int64) error {
	off, total, equal, err := checkCounts("all-gather", counts, c.size)
	if err != nil {
		return err
	}
	sp, err := c.ptr(send, 0, counts[c.rank], "all-gather send")
	if err != nil {
		return err
	}
	rp, err := c.ptr(recv, 0, total, "all-gather recv")
	if err != nil || total == 0 {
		return err
	}
	return c.collective(ctx, "all-gather", func() error {
		if equal {
			return c.lib.allGather(sp, rp, uint64(counts[0]), ncclUint8, c.h, c.sh)
		}
		return c.lib.group(func() error {
			for q := range c.size {
				if q == c.rank {
					continue
				}
				if err := c.lib.send(sp, uint64(counts[c.rank]), ncclUint8, q, c.h, c.sh); err != nil {
					return err
				}
				if err := c.lib.recv(rp+uintptr(off[q]), uint64(counts[q]), ncclUint8, q, c.h, c.sh); err != nil {
					return err
				}
			}
			// This rank's own chunk: a send to itself.
			if err := c.lib.send(sp, uint64(counts[c.rank]), ncclUint8, c.rank, c.h, c.sh); err != nil {
				return err
			}
			return c.lib.recv(rp+uintptr(off[c.rank]), uint64(counts[c.rank]), ncclUint8, c.rank, c.h, c.sh)
		})
	})
}

// ReduceScatter sums send (sum(counts) float32 on every rank) over the
// ranks and leaves this rank's chunk (counts[rank] elements) in recv:
// rank-ordered (bit-exact) by default, ncclReduceScatter (equal counts
// only) with Options.NativeReductions.
func (c *Comm) ReduceScatter(ctx context.Context, send, recv accel.Mem, counts []int64) error {
	off, total, equal, err := checkCounts("reduce-scatter", counts, c.size)
	if err != nil {
		return err
	}
	sp, err := c.ptr(send, 0, 4*total, "reduce-scatter send")
	if err != nil {
		return err
	}
	mine := counts[c.rank]
	rp, err := c.ptr(recv, 0, 4*mine, "reduce-scatter recv")
	if err != nil || total == 0 {
		return err
	}
	if c.opts.NativeReductions {
		if !equal {
			return fmt.Errorf("nccl: reduce-scatter: ncclReduceScatter needs equal counts, got %v (pad the partitions, or use the rank-ordered reduction)", counts)
		}
		return c.collective(ctx, "reduce-scatter", func() error {
			return c.lib.reduceScatter(sp, rp, uint64(mine), ncclFloat32, ncclSum, c.h, c.sh)
		})
	}
	// Every rank's chunk of this rank, side by side in scratch.
	scratch, err := c.scratchFor(4 * mine * int64(c.size))
	if err != nil {
		return err
	}
	xp, err := c.ptr(scratch, 0, 4*mine*int64(c.size), "reduce-scatter scratch")
	if err != nil {
		return err
	}
	err = c.collective(ctx, "reduce-scatter", func() error {
		return c.lib.group(func() error {
			for q := range c.size {
				if err := c.lib.send(sp+uintptr(4*off[q]), uint64(counts[q]), ncclFloat32, q, c.h, c.sh); err != nil {
					return err
				}
				if err := c.lib.recv(xp+uintptr(4*mine*int64(q)), uint64(mine), ncclFloat32, q, c.h, c.sh); err != nil {
					return err
				}
			}
			return nil
		})
	})
	if err != nil || mine == 0 {
		return err
	}
	return c.sumOnHost(ctx, scratch, recv, mine, comm.Sum, false)
}

// sumOnHost copies size chunks of n float32 (or float64) from scratch,
// reduces them in rank order on the host and writes the result to dst.
func (c *Comm) sumOnHost(ctx context.Context, scratch, dst accel.Mem, n int64, op comm.Op, f64 bool) error {
	elem := int64(4)
	if f64 {
		elem = 8
	}
	host := make([]byte, elem*n*int64(c.size))
	out := make([]byte, elem*n)
	return c.run(func() error {
		if err := c.dev.CopyFromDevice(c.stream, host, scratch, 0); err != nil {
			return err
		}
		if err := c.stream.Synchronize(); err != nil {
			return err
		}
		if f64 {
			vals := unsafe.Slice((*float64)(unsafe.Pointer(&host[0])), n*int64(c.size))
			res := unsafe.Slice((*float64)(unsafe.Pointer(&out[0])), n)
			copy(res, vals[:n])
			for q := int64(1); q < int64(c.size); q++ {
				for i, x := range vals[q*n : (q+1)*n] {
					res[i] = reduce64(res[i], x, op)
				}
			}
		} else {
			vals := unsafe.Slice((*float32)(unsafe.Pointer(&host[0])), n*int64(c.size))
			res := unsafe.Slice((*float32)(unsafe.Pointer(&out[0])), n)
			copy(res, vals[:n])
			for q := int64(1); q < int64(c.size); q++ {
				for i, x := range vals[q*n : (q+1)*n] {
					res[i] = reduce32(res[i], x, op)
				}
			}
		}
		if err := c.dev.CopyToDevice(c.stream, dst, 0, out); err != nil {
			return err
		}
		return c.stream.Synchronize()
	})
}

func reduce32(a, b float32, op comm.Op) float32 {
	if op == comm.Sum {
		return a + b
	}
	if a != a || b != b {
		return float32(math.NaN())
	}
	return max(a, b)
}

func reduce64(a, b float64, op comm.Op) float64 {
	if op == comm.Sum {
		return a + b
	}
	if a != a || b != b {
		return math.NaN()
	}
	return max(a, b)
}

// scratchFor returns device scratch memory of at least n bytes (kept
// between calls).
func (c *Comm) scratchFor(n int64) (accel.Mem, error) {
	if c.scratch != nil && c.scratch.Size() >= n {
		return c.scratch, nil
	}
	if c.scratch != nil {
		if err := c.dev.Free(c.scratch); err != nil {
			return nil, err
		}
		c.scratch = nil
	}
	m, err := c.dev.Alloc(max(n, 1))
	if err != nil {
		return nil, fmt.Errorf("nccl: scratch for a rank-ordered reduction (%d bytes): %w", n, err)
	}
	c.scratch = m
	return m, nil
}

// AllReduce reduces n float32 of buf over the ranks, in place:
// rank-ordered (an all-gather, then the sum on the host) by default,
// ncclAllReduce with Options.NativeReductions.
func (c *Comm) AllReduce(ctx context.Context, buf accel.Mem, n int64, op comm.Op) error {
	return c.allReduce(ctx, buf, n, op, false)
}

// AllReduceFloat64 is AllReduce for n float64.
func (c *Comm) AllReduceFloat64(ctx context.Context, buf accel.Mem, n int64, op comm.Op) error {
	return c.allReduce(ctx, buf, n, op, true)
}

func (c *Comm) allReduce(ctx context.Context, buf accel.Mem, n int64, op comm.Op, f64 bool) error {
	if op != comm.Sum && op != comm.Max {
		return fmt.Errorf("nccl: all-reduce: unknown operator %v", op)
	}
	elem, dt := int64(4), ncclFloat32
	if f64 {
		elem, dt = 8, ncclFloat64
	}
	bp, err := c.ptr(buf, 0, elem*n, "all-reduce")
	if err != nil || n == 0 {
		return err
	}
	nop := ncclSum
	if op == comm.Max {
		nop = ncclMax
	}
	if c.opts.NativeReductions {
		return c.collective(ctx, "all-reduce", func() error { return c.lib.allReduce(bp, bp, uint64(n), dt, nop, c.h, c.sh) })
	}
	scratch, err := c.scratchFor(elem * n * int64(c.size))
	if err != nil {
		return err
	}
	xp, err := c.ptr(scratch, 0, elem*n*int64(c.size), "all-reduce scratch")
	if err != nil {
		return err
	}
	if err := c.collective(ctx, "all-reduce", func() error {
		return c.lib.allGather(bp, xp, uint64(elem*n), ncclUint8, c.h, c.sh)
	}); err != nil {
		return err
	}
	return c.sumOnHost(ctx, scratch, buf, n, op, f64)
}

// Broadcast copies root's first n bytes of buf into every rank's buf.
func (c *Comm) Broadcast(ctx context.Context, buf accel.Mem, n int64, root int) error {
	if root < 0 || root >= c.size {
		return fmt.Errorf("nccl: broadcast: root %d is outside the world of %d ranks", root, c.size)
	}
	bp, err := c.ptr(buf, 0, n, "broadcast")
	if err != nil || n == 0 {
		return err
	}
	return c.collective(ctx, "broadcast", func() error { return c.lib.broadcast(bp, bp, uint64(n), ncclUint8, root, c.h, c.sh) })
}

// Barrier returns once every rank has entered it (an all-reduce of one
// float on the device).
func (c *Comm) Barrier(ctx context.Context) error {
	m, err := c.scratchFor(4)
	if err != nil {
		return err
	}
	p, err := c.ptr(m, 0, 4, "barrier")
	if err != nil {
		return err
	}
	return c.collective(ctx, "barrier", func() error { return c.lib.allReduce(p, p, 1, ncclFloat32, ncclSum, c.h, c.sh) })
}

// library is the loaded NCCL (nccl_cgo.go; none without cgo).
type library interface {
	version() (int, error)
	uniqueID(id []byte) error
	initRank(n int, id []byte, rank int) (uintptr, error)
	commDestroy(h uintptr) error
	commAbort(h uintptr) error
	asyncError(h uintptr) (int, error)
	errorOf(call string, code int) error
	allGather(send, recv uintptr, count uint64, dt int, h, st uintptr) error
	reduceScatter(send, recv uintptr, count uint64, dt, op int, h, st uintptr) error
	allReduce(send, recv uintptr, count uint64, dt, op int, h, st uintptr) error
	broadcast(send, recv uintptr, count uint64, dt, root int, h, st uintptr) error
	send(buf uintptr, count uint64, dt, peer int, h, st uintptr) error
	recv(buf uintptr, count uint64, dt, peer int, h, st uintptr) error
	// group runs f between ncclGroupStart and ncclGroupEnd.
	group(f func() error) error
}

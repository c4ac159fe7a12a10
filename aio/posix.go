package aio

import (
	"sync"

	"golang.org/x/sys/unix"
)

// posixRing runs pread/pwrite on a bounded pool of goroutines, one per
// queue slot. It works on any filesystem; it is the fallback when neither
// io_uring nor kernel AIO is usable.
type posixRing struct {
	ops     chan posixOp
	comps   chan completion
	pending []posixOp // prepped, not yet submitted
	wg      sync.WaitGroup
}

type posixOp struct {
	op    Op
	fd    int
	buf   []byte
	off   int64
	token uint32
}

var _ ring = (*posixRing)(nil)

func newPosixRing(entries int) (ring, error) {
	r := &posixRing{
		ops:     make(chan posixOp, entries),
		comps:   make(chan completion, entries),
		pending: make([]posixOp, 0, entries),
	}
	r.wg.Add(entries)
	for i := 0; i < entries; i++ {
		go r.serve()
	}
	return r, nil
}

func (r *posixRing) serve() {
	defer r.wg.Done()
	for op := range r.ops {
		var n int
		var err error
		if op.op == OpRead {
			n, err = unix.Pread(op.fd, op.buf, op.off)
		} else {
			n, err = unix.Pwrite(op.fd, op.buf, op.off)
		}
		res := int32(n)
		if err != nil {
			if en, ok := err.(unix.Errno); ok {
				res = -int32(en)
			} else {
				res = -int32(unix.EIO)
			}
		}
		r.comps <- completion{token: op.token, res: res}
	}
}

func (r *posixRing) prep(op Op, t target, buf []byte, off int64, token uint32) {
	r.pending = append(r.pending, posixOp{op: op, fd: t.fd, buf: buf, off: off, token: token})
}

func (r *posixRing) fixedBuffer([]byte) bool { return false }

func (r *posixRing) registerBuffers([][]byte) error  { return errFixedUnsupported }
func (r *posixRing) registerFile(int) (int32, error) { return -1, errFixedUnsupported }
func (r *posixRing) unregisterFile(int32) error      { return errFixedUnsupported }

func (r *posixRing) submit() error {
	for i := range r.pending {
		r.ops <- r.pending[i]
		r.pending[i] = posixOp{}
	}
	r.pending = r.pending[:0]
	return nil
}

func (r *posixRing) wait(minN int, out []completion) (int, error) {
	n := 0
	for n < minN && n < len(out) {
		out[n] = <-r.comps
		n++
	}
	for n < len(out) {
		select {
		case c := <-r.comps:
			out[n] = c
			n++
		default:
			return n, nil
		}
	}
	return n, nil
}

func (r *posixRing) capacity() int { return cap(r.ops) }

func (r *posixRing) close() error {
	close(r.ops)
	r.wg.Wait()
	return nil
}

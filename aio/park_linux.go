package aio

import (
	"errors"
	"os"
	"time"

	"golang.org/x/sys/unix"
)

// parkMax bounds one park: a kernel that did not signal the eventfd for
// some completion costs that completion at most this long, never a hang.
const parkMax = 2 * time.Millisecond

// parkRounds is how many parks in a row one wait takes before it blocks in
// the kernel instead: a wait is bounded even where polls find nothing that
// the eventfd said had finished.
const parkRounds = 64

// parker is an eventfd the kernel signals when a ring's operation
// completes, which the ring's wait parks on in Go's netpoller instead of
// blocking in a syscall (io_uring_enter, io_getevents).
//
// Why: Go treats a syscall as short and lets the thread in it keep its
// processor (P) until the runtime's monitor takes it back, and the monitor
// sleeps up to 10 ms between rounds when the process is busy. A worker
// blocked in the kernel for completions kept one of the test machine's two
// Ps about 60% of the time, while the GoMLX backend's matrix products
// queued their second half on the other P and ran it after the first: the
// model computed as if on one core (BENCHMARKS.md, "The I/O thread that
// held a processor"). A goroutine parked in the netpoller gives its P back
// at once.
type parker struct {
	f     *os.File // nil: none (the ring blocks in the kernel)
	fd    int      // f's descriptor (File.Fd would make it blocking)
	parks int      // park calls (tests)
	buf   [8]byte  // the eventfd's counter, read here (a local escaped: an allocation per park)
}

// newParker makes a non-blocking eventfd, hands it to register (which
// ties it to the ring), and returns it as a pollable parker; a zero parker
// where either step fails.
func newParker(register func(efd int) error) parker {
	efd, err := unix.Eventfd(0, unix.EFD_NONBLOCK|unix.EFD_CLOEXEC)
	if err != nil {
		return parker{}
	}
	if err := register(efd); err != nil {
		unix.Close(efd)
		return parker{}
	}
	return parker{f: os.NewFile(uintptr(efd), "aio eventfd"), fd: efd}
}

// ok says whether the parker has an eventfd.
func (p *parker) ok() bool { return p.f != nil }

// park waits on the eventfd for at most parkMax. A failure other than the
// deadline drops the eventfd, so that the ring blocks in the kernel again.
func (p *parker) park() {
	p.parks++
	if err := p.f.SetReadDeadline(time.Now().Add(parkMax)); err != nil {
		p.drop()
		return
	}
	if _, err := p.f.Read(p.buf[:]); err != nil && !errors.Is(err, os.ErrDeadlineExceeded) {
		p.drop()
	}
}

// drop closes the eventfd (after the ring is gone, or to stop parking).
func (p *parker) drop() {
	if p.f != nil {
		p.f.Close()
		p.f, p.fd = nil, -1
	}
}

//go:build mpi && cgo

package comm

/*
#cgo pkg-config: ompi
#include <mpi.h>
#include <stdlib.h>
#include <string.h>

// Every MPI call of the binding is one of these small functions: MPI's
// handles and constants (MPI_COMM_WORLD, MPI_FLOAT, MPI_SUM) are macros
// over global structs in Open MPI, so only ints and pointers cross to Go.
// They run on the binding's one goroutine, locked to its OS thread
// (MPI_THREAD_SERIALIZED).

static MPI_Comm zc_data = MPI_COMM_NULL; // the collectives
static MPI_Comm zc_ctl = MPI_COMM_NULL;  // notes: a rank telling the others it failed
static MPI_Request zc_req = MPI_REQUEST_NULL;     // the collective in flight
static MPI_Request zc_ctl_req = MPI_REQUEST_NULL; // the posted receive of a note
static MPI_Request zc_beat_req = MPI_REQUEST_NULL; // the posted receive of a heartbeat
static char zc_beat_in, zc_beat_out;
static int zc_own_init = 0;

enum { ZC_TAG_NOTE = 1, ZC_TAG_BEAT = 2 };

static int zc_init(int *provided, int *rank, int *size, int *own) {
	int flag = 0, fin = 0, rc;
	MPI_Finalized(&fin);
	if (fin) return -1;
	MPI_Initialized(&flag);
	if (!flag) {
		rc = MPI_Init_thread(NULL, NULL, MPI_THREAD_SERIALIZED, provided);
		if (rc != MPI_SUCCESS) return rc;
		zc_own_init = 1;
	} else {
		MPI_Query_thread(provided);
	}
	*own = zc_own_init;
	MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
	if ((rc = MPI_Comm_dup(MPI_COMM_WORLD, &zc_data)) != MPI_SUCCESS) return rc;
	if ((rc = MPI_Comm_dup(MPI_COMM_WORLD, &zc_ctl)) != MPI_SUCCESS) return rc;
	MPI_Comm_set_errhandler(zc_data, MPI_ERRORS_RETURN);
	MPI_Comm_set_errhandler(zc_ctl, MPI_ERRORS_RETURN);
	MPI_Comm_rank(zc_data, rank);
	return MPI_Comm_size(zc_data, size);
}

static int zc_error_string(int code, char *buf, int cap) {
	int n = 0;
	char s[MPI_MAX_ERROR_STRING];
	if (MPI_Error_string(code, s, &n) != MPI_SUCCESS) return 0;
	if (n >= cap) n = cap - 1;
	memcpy(buf, s, n);
	buf[n] = 0;
	return n;
}

static int zc_error_class(int code) {
	int cls = code;
	MPI_Error_class(code, &cls);
	return cls;
}

static int zc_is_truncate(int cls) { return cls == MPI_ERR_TRUNCATE; }

// zc_test tests the collective in flight. On an error the request is
// left as it is (MPI frees it only on completion).
static int zc_test(int *done) {
	MPI_Status st;
	return MPI_Test(&zc_req, done, &st);
}

static int zc_allgather_blocking(const void *send, int n, void *recv) {
	return MPI_Allgather(send, n, MPI_BYTE, recv, n, MPI_BYTE, zc_ctl);
}

static int zc_iallgatherv(const void *send, int scount, void *recv, const int *rcounts, const int *displs, int inplace) {
	return MPI_Iallgatherv(inplace ? MPI_IN_PLACE : send, scount, MPI_BYTE, recv, rcounts, displs, MPI_BYTE, zc_data, &zc_req);
}

static int zc_ialltoallv(const void *send, const int *sc, const int *sd, void *recv, const int *rc, const int *rd) {
	return MPI_Ialltoallv(send, sc, sd, MPI_FLOAT, recv, rc, rd, MPI_FLOAT, zc_data, &zc_req);
}

static int zc_ibcast(void *buf, int n, int root) {
	return MPI_Ibcast(buf, n, MPI_BYTE, root, zc_data, &zc_req);
}

static int zc_ibarrier(void) { return MPI_Ibarrier(zc_data, &zc_req); }

static int zc_iallreduce(void *buf, int n, int dbl, int max) {
	return MPI_Iallreduce(MPI_IN_PLACE, buf, n, dbl ? MPI_DOUBLE : MPI_FLOAT, max ? MPI_MAX : MPI_SUM, zc_data, &zc_req);
}

static int zc_ireduce_scatter(const void *send, void *recv, const int *counts) {
	return MPI_Ireduce_scatter(send, recv, counts, MPI_FLOAT, MPI_SUM, zc_data, &zc_req);
}

static int zc_note_post(void *buf, int cap) {
	return MPI_Irecv(buf, cap, MPI_BYTE, MPI_ANY_SOURCE, ZC_TAG_NOTE, zc_ctl, &zc_ctl_req);
}

static int zc_note_test(int *done, int *source, int *count) {
	MPI_Status st;
	int rc = MPI_Test(&zc_ctl_req, done, &st);
	if (rc == MPI_SUCCESS && *done) {
		*source = st.MPI_SOURCE;
		MPI_Get_count(&st, MPI_BYTE, count);
	}
	return rc;
}

// zc_note_send sends a note; the request goes into reqs[i] (C memory),
// the message must stay valid until it completes.
static int zc_note_send(const void *msg, int n, int dest, MPI_Request *reqs, int i) {
	return MPI_Isend(msg, n, MPI_BYTE, dest, ZC_TAG_NOTE, zc_ctl, &reqs[i]);
}

// Heartbeats: one byte on the control communicator, from every rank to
// every other, every MPIOptions.HeartbeatInterval; a rank waiting in a
// collective fails the world when a peer has been silent for
// HeartbeatTimeout (stopped with SIGSTOP, hung), naming it.
static int zc_beat_post(void) {
	return MPI_Irecv(&zc_beat_in, 1, MPI_BYTE, MPI_ANY_SOURCE, ZC_TAG_BEAT, zc_ctl, &zc_beat_req);
}

static int zc_beat_test(int *done, int *source) {
	MPI_Status st;
	int rc = MPI_Test(&zc_beat_req, done, &st);
	if (rc == MPI_SUCCESS && *done) *source = st.MPI_SOURCE;
	return rc;
}

// zc_beat_send sends a heartbeat to dest unless the last one to it is
// still in flight (a peer that does not receive gets no pile of them).
static int zc_beat_send(int dest, MPI_Request *reqs) {
	int done = 1, rc;
	if (reqs[dest] != MPI_REQUEST_NULL) {
		if ((rc = MPI_Test(&reqs[dest], &done, MPI_STATUS_IGNORE)) != MPI_SUCCESS) return rc;
	}
	if (!done) return MPI_SUCCESS;
	return MPI_Isend(&zc_beat_out, 1, MPI_BYTE, dest, ZC_TAG_BEAT, zc_ctl, &reqs[dest]);
}

// zc_beats_end cancels the heartbeat receive and the sends still in
// flight, before MPI_Finalize.
static void zc_beats_end(MPI_Request *reqs, int n) {
	if (zc_beat_req != MPI_REQUEST_NULL) {
		MPI_Cancel(&zc_beat_req);
		MPI_Wait(&zc_beat_req, MPI_STATUS_IGNORE);
	}
	for (int i = 0; i < n; i++) {
		int done = 1;
		if (reqs[i] == MPI_REQUEST_NULL) continue;
		MPI_Test(&reqs[i], &done, MPI_STATUS_IGNORE);
		if (!done) {
			MPI_Cancel(&reqs[i]);
			MPI_Wait(&reqs[i], MPI_STATUS_IGNORE);
		}
	}
}

static int zc_notes_test(MPI_Request *reqs, int n, int *done) {
	return MPI_Testall(n, reqs, done, MPI_STATUSES_IGNORE);
}

static MPI_Request *zc_requests(int n) {
	MPI_Request *r = malloc((n > 0 ? n : 1) * sizeof *r);
	for (int i = 0; i < n; i++) r[i] = MPI_REQUEST_NULL;
	return r;
}

static int zc_finalize(void) {
	if (zc_ctl_req != MPI_REQUEST_NULL) {
		MPI_Cancel(&zc_ctl_req);
		MPI_Wait(&zc_ctl_req, MPI_STATUS_IGNORE);
	}
	MPI_Comm_free(&zc_data);
	MPI_Comm_free(&zc_ctl);
	if (!zc_own_init) return MPI_SUCCESS;
	return MPI_Finalize();
}

static int zc_thread_serialized(int provided) { return provided >= MPI_THREAD_SERIALIZED; }

// The bare, blocking collectives the benchmarks compare the binding with.
static int zc_bare_allgather(const void *send, int n, void *recv) {
	return MPI_Allgather(send, n, MPI_BYTE, recv, n, MPI_BYTE, zc_data);
}
static int zc_bare_reduce_scatter_block(const void *send, void *recv, int n) {
	return MPI_Reduce_scatter_block(send, recv, n, MPI_FLOAT, MPI_SUM, zc_data);
}
static int zc_bare_alltoall(const void *send, void *recv, int n) {
	return MPI_Alltoall(send, n, MPI_FLOAT, recv, n, MPI_FLOAT, zc_data);
}
*/
import "C"

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"time"
	"unsafe"
)

// MPIBuilt reports whether this binary has the MPI binding (the mpi build
// tag).
func MPIBuilt() bool { return true }

// noteBytes bounds a failure note (the error text of a failed rank).
const noteBytes = 4096

// mpiState is the process's one MPI world: MPI is initialized once per
// process and cannot be initialized again after MPI_Finalize.
var mpiState struct {
	sync.Mutex
	open      bool
	finalized bool
}

// NewMPI joins the world of processes started by mpirun (or srun, or
// any launcher Open MPI's runtime understands): this process's Comm. A
// binary started without a launcher is a world of one. MPI is
// initialized with MPI_THREAD_SERIALIZED and driven from one goroutine
// locked to its OS thread; every collective is non-blocking underneath
// and polled, so that a failed peer, Abort, the context and the stall
// timeout can end it (see MPIOptions). One world per process: NewMPI
// fails while one is open, and after it was closed (MPI cannot be
// initialized twice).
//
// Reductions are rank-ordered and bit-exact unless
// MPIOptions.NativeReductions is set: ReduceScatter is an all-to-all of
// the chunks followed by a sum in rank order, AllReduce an all-gather
// followed by the same sum.
func NewMPI(opts MPIOptions) (Comm, error) {
	if err := opts.validate(); err != nil {
		return nil, err
	}
	mpiState.Lock()
	defer mpiState.Unlock()
	switch {
	case mpiState.open:
		return nil, errors.New("comm: MPI: this process already has an open MPI world (one per process)")
	case mpiState.finalized:
		return nil, errors.New("comm: MPI: the world was closed and MPI finalized; MPI cannot be initialized again in this process")
	}
	if _, ok := os.LookupEnv("OMPI_MCA_opal_signal"); !ok {
		// Go owns the process's signal handlers; Open MPI must not take
		// SIGSEGV, SIGBUS and friends for its own backtraces.
		os.Setenv("OMPI_MCA_opal_signal", "")
	}
	w := &mpiWorld{opts: opts, reqs: make(chan *mpiCall), kick: make(chan struct{}, 1), stopped: make(chan struct{}),
		segElems: opts.SegmentBytes / 4, pollBackoff: [2]time.Duration{opts.PollMin, opts.PollMax}}
	ready := make(chan error, 1)
	go w.loop(ready)
	if err := <-ready; err != nil {
		return nil, err
	}
	mpiState.open = true
	return w, nil
}

// mpiCall is one request to the worker goroutine.
type mpiCall struct {
	run  func() error
	done chan error
}

type peerInfo struct {
	local bool   // on this host (same kernel boot and PID namespace)
	pid   int    //
	start uint64 // its start time in clock ticks since boot (PID reuse)
}

type mpiWorld struct {
	opts       MPIOptions
	rank, size int
	peers      []peerInfo

	reqs    chan *mpiCall
	kick    chan struct{} // Abort wakes the worker
	stopped chan struct{} // closed when the worker returns

	mu       sync.Mutex
	failed   *RankError // the world's failure, once it failed
	failedAt time.Time
	abortErr error // Abort's error, until the worker has sent the notes
	closed   bool

	// Worker-only state.
	noteBuf     unsafe.Pointer   // C memory: the posted note receive
	noteReqs    *C.MPI_Request   // C memory: one send request per peer
	noteMsg     unsafe.Pointer   // C memory: the note this rank sent
	notesSent   bool             //
	lastLive    time.Time        //
	beatReqs    *C.MPI_Request   // C memory: the heartbeat send in flight to each peer
	lastBeat    time.Time        // when this rank last sent its heartbeats
	lastWatch   time.Time        // when watch last ran
	heard       []time.Time      // when each peer's heartbeat last arrived
	scratch32   []float32        //
	intBufs     [6][]C.int       //
	ownInit     bool             //
	fin         bool             // Close ran: the worker stops
	stats       MPIStats         //
	statsMu     sync.Mutex       //
	segElems    int              // reduce-scatter segment, in elements
	pollBackoff [2]time.Duration // first and largest sleep between tests
}

var _ Comm = (*mpiWorld)(nil)

// MPIStats counts what an MPI world moved (this rank).
type MPIStats struct {
	Collectives int64
	// BytesSent and BytesReceived count payload bytes of the collectives
	// as the algorithm addresses them (an all-gather receives every other
	// rank's chunk), not the transport's own copies.
	BytesSent, BytesReceived int64
	// Wait is the time spent in collectives.
	Wait time.Duration
}

func (w *mpiWorld) Rank() int { return w.rank }
func (w *mpiWorld) Size() int { return w.size }

// Stats returns the counters (safe from any goroutine).
func (w *mpiWorld) Stats() MPIStats {
	w.statsMu.Lock()
	defer w.statsMu.Unlock()
	return w.stats
}

func (w *mpiWorld) count(sent, recv int64, d time.Duration) {
	w.statsMu.Lock()
	w.stats.Collectives++
	w.stats.BytesSent += sent
	w.stats.BytesReceived += recv
	w.stats.Wait += d
	w.statsMu.Unlock()
}

func mpiError(op string, rc C.int) error {
	buf := make([]byte, 512)
	n := C.zc_error_string(rc, (*C.char)(unsafe.Pointer(&buf[0])), C.int(len(buf)))
	text := string(buf[:n])
	if C.zc_is_truncate(C.zc_error_class(rc)) != 0 {
		return &RankError{Rank: -1, Op: op, Err: fmt.Errorf("%w: MPI: %s (a rank sent more than this rank expected)", ErrMismatch, text)}
	}
	return &RankError{Rank: -1, Op: op, Err: fmt.Errorf("MPI error %d: %s", int(rc), text)}
}

// loop is the worker: it initializes MPI on its locked thread, runs the
// calls one at a time, and between them watches for notes from failed
// ranks and for peers that died.
func (w *mpiWorld) loop(ready chan<- error) {
	runtime.LockOSThread()
	defer close(w.stopped)
	var provided, rank, size, own C.int
	if rc := C.zc_init(&provided, &rank, &size, &own); rc != 0 {
		if rc == -1 {
			ready <- errors.New("comm: MPI: MPI was finalized in this process")
		} else {
			ready <- fmt.Errorf("comm: MPI_Init_thread: %w", mpiError("init", rc))
		}
		return
	}
	w.rank, w.size, w.ownInit = int(rank), int(size), own != 0
	if C.zc_thread_serialized(provided) == 0 {
		ready <- fmt.Errorf("comm: MPI: the library provides thread level %d, below MPI_THREAD_SERIALIZED", int(provided))
		return
	}
	if err := w.exchangePeers(); err != nil {
		ready <- err
		return
	}
	w.noteBuf = C.malloc(noteBytes)
	w.noteReqs = C.zc_requests(C.int(w.size))
	if rc := C.zc_note_post(w.noteBuf, noteBytes); rc != 0 {
		ready <- fmt.Errorf("comm: MPI: posting the failure-note receive: %w", mpiError("init", rc))
		return
	}
	w.beatReqs = C.zc_requests(C.int(w.size))
	if rc := C.zc_beat_post(); rc != 0 {
		ready <- fmt.Errorf("comm: MPI: posting the heartbeat receive: %w", mpiError("init", rc))
		return
	}
	w.heard = make([]time.Time, w.size)
	now := time.Now()
	for q := range w.heard {
		w.heard[q] = now
	}
	w.lastWatch = now
	ready <- nil
	tick := time.NewTicker(w.opts.IdlePoll)
	defer tick.Stop()
	for {
		select {
		case c := <-w.reqs:
			c.done <- c.run()
			if w.fin {
				return // closed: no MPI call may follow
			}
		case <-w.kick:
			w.watch("idle")
		case <-tick.C:
			w.watch("idle")
		}
	}
}

// hostKey identifies this kernel and PID namespace: peers with the same
// key can be checked for liveness by PID.
func hostKey() [32]byte {
	boot, _ := os.ReadFile("/proc/sys/kernel/random/boot_id")
	ns, _ := os.Readlink("/proc/self/ns/pid")
	host, _ := os.Hostname()
	if len(boot) == 0 || ns == "" {
		// No way to check peers by PID: a key no other rank shares.
		return sha256.Sum256([]byte(fmt.Sprintf("%s/%d/%d", host, os.Getpid(), time.Now().UnixNano())))
	}
	return sha256.Sum256([]byte(string(boot) + "|" + ns + "|" + host))
}

// procStart returns a process's state letter and start time (field 22 of
// /proc/PID/stat, clock ticks since boot).
func procStart(pid int) (state byte, start uint64, err error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, 0, err
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, 0, errors.New("malformed stat")
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 20 {
		return 0, 0, errors.New("malformed stat")
	}
	start, err = strconv.ParseUint(f[19], 10, 64)
	return f[0][0], start, err
}

// exchangePeers tells every rank where every other one runs (a blocking
// all-gather on the control communicator, at start).
func (w *mpiWorld) exchangePeers() error {
	const rec = 48
	key := hostKey()
	_, start, err := procStart(os.Getpid())
	if err != nil {
		start = 0
	}
	mine := make([]byte, rec)
	copy(mine, key[:])
	binary.LittleEndian.PutUint64(mine[32:], uint64(os.Getpid()))
	binary.LittleEndian.PutUint64(mine[40:], start)
	all := make([]byte, rec*w.size)
	if rc := C.zc_allgather_blocking(unsafe.Pointer(&mine[0]), rec, unsafe.Pointer(&all[0])); rc != 0 {
		return fmt.Errorf("comm: MPI: exchanging process ids: %w", mpiError("init", rc))
	}
	w.peers = make([]peerInfo, w.size)
	for r := range w.peers {
		b := all[r*rec:]
		w.peers[r] = peerInfo{local: string(b[:32]) == string(key[:]) && start != 0,
			pid: int(binary.LittleEndian.Uint64(b[32:])), start: binary.LittleEndian.Uint64(b[40:])}
	}
	return nil
}

// ErrRankGone says that a rank's process ended (killed, crashed or
// exited) while the world was open.
var ErrRankGone = errors.New("comm: the rank's process is gone")

// RemoteError is a failed rank's own error, as its note carried it to
// the other ranks (it matches ErrAborted with errors.Is).
type RemoteError struct{ Msg string }

func (e *RemoteError) Error() string        { return e.Msg }
func (e *RemoteError) Is(target error) bool { return target == ErrAborted }

// fail records the world's failure (the first one stays) and returns it.
func (w *mpiWorld) fail(e *RankError) *RankError {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.failed == nil {
		w.failed = e
		w.failedAt = time.Now()
	}
	return w.failed
}

func (w *mpiWorld) failure() *RankError {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.failed
}

// sendNotes tells every other rank that this one failed, with err's
// text. Worker only; once.
func (w *mpiWorld) sendNotes(err error) {
	if w.notesSent {
		return
	}
	w.notesSent = true
	msg := err.Error()
	if len(msg) > noteBytes-1 {
		msg = msg[:noteBytes-1]
	}
	cs := C.CString(msg)
	w.noteMsg = unsafe.Pointer(cs)
	for q := range w.size {
		if q == w.rank || (w.peers[q].local && !w.peerAlive(q)) {
			continue
		}
		C.zc_note_send(w.noteMsg, C.int(len(msg)), C.int(q), w.noteReqs, C.int(q))
	}
}

// peerAlive checks a process on this host by PID and start time (a
// zombie, or a PID reused by another process, is gone).
func (w *mpiWorld) peerAlive(q int) bool {
	p := w.peers[q]
	if !p.local {
		return true
	}
	state, start, err := procStart(p.pid)
	if err != nil {
		return !errors.Is(err, os.ErrNotExist)
	}
	return state != 'Z' && state != 'X' && start == p.start
}

// ErrRankSilent says that a rank's process sent no heartbeat for
// MPIOptions.HeartbeatTimeout while another rank waited for it in a
// collective: it is stopped (SIGSTOP, a debugger), hung, or cut off.
var ErrRankSilent = errors.New("comm: the rank is silent")

// beat sends this rank's heartbeats when they are due, takes in the
// peers', and, in a collective (inCollective), fails the world naming the
// first peer silent for longer than HeartbeatTimeout. Worker only.
func (w *mpiWorld) beat(op string, inCollective bool) {
	now := time.Now()
	if gap := now.Sub(w.lastWatch); gap > w.opts.HeartbeatTimeout/2 {
		// This rank itself did not look for a while (it was stopped, or
		// not scheduled): the peers' silence is not theirs. Start over.
		for q := range w.heard {
			w.heard[q] = now
		}
	}
	w.lastWatch = now
	if now.Sub(w.lastBeat) >= w.opts.HeartbeatInterval {
		w.lastBeat = now
		for q := range w.size {
			if q != w.rank {
				C.zc_beat_send(C.int(q), w.beatReqs)
			}
		}
	}
	for range 4 * w.size { // bounded: a flood of beats cannot keep the worker here
		var done, src C.int
		if rc := C.zc_beat_test(&done, &src); rc != 0 || done == 0 {
			break
		}
		if s := int(src); s >= 0 && s < w.size {
			w.heard[s] = now
		}
		if rc := C.zc_beat_post(); rc != 0 {
			break
		}
	}
	if !inCollective || w.opts.HeartbeatTimeout <= 0 {
		return
	}
	for q := range w.size {
		if q == w.rank {
			continue
		}
		if silent := now.Sub(w.heard[q]); silent > w.opts.HeartbeatTimeout {
			w.fail(&RankError{Rank: q, Op: op, Err: fmt.Errorf("%w: no heartbeat from its process for %v (MPIOptions.HeartbeatTimeout %v): stopped (SIGSTOP, a debugger), hung or cut off",
				ErrRankSilent, silent.Round(time.Millisecond), w.opts.HeartbeatTimeout)})
			return
		}
	}
}

// watch looks for what ends the world: an Abort on this rank (sending
// the notes), a note from a failed rank, a peer on this host that died,
// a peer that is silent while this rank waits for it in a collective
// (any op but "idle" and "close"). It returns the world's failure, if
// any. Worker only.
func (w *mpiWorld) watch(op string) *RankError {
	w.beat(op, op != "idle" && op != "close")
	w.mu.Lock()
	abortErr := w.abortErr
	w.abortErr = nil
	w.mu.Unlock()
	if abortErr != nil {
		w.sendNotes(abortErr)
	}
	var done, src, n C.int
	if rc := C.zc_note_test(&done, &src, &n); rc == 0 && done != 0 {
		msg := C.GoStringN((*C.char)(w.noteBuf), n)
		w.fail(&RankError{Rank: int(src), Op: op, Err: &RemoteError{Msg: msg}})
		C.zc_note_post(w.noteBuf, noteBytes) // keep a receive posted for the next note
	}
	if time.Since(w.lastLive) >= w.opts.LivenessInterval {
		w.lastLive = time.Now()
		for q := range w.size {
			if q != w.rank && !w.peerAlive(q) {
				p := w.peers[q]
				w.fail(&RankError{Rank: q, Op: op, Err: fmt.Errorf("%w: process %d on this host ended (killed, crashed or exited) while the world was open", ErrRankGone, p.pid)})
				break
			}
		}
	}
	return w.failure()
}

// do runs f on the worker and returns its error; a world that failed,
// or was closed, refuses at once.
func (w *mpiWorld) do(ctx context.Context, op string, f func() error) error {
	if err := w.refuse(op); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		// A rank that cannot take part fails the world at once (as the
		// in-process world does), rather than leave the others to wait.
		f = func() error {
			e := w.fail(&RankError{Rank: w.rank, Op: op, Err: err})
			w.sendNotes(e)
			return e
		}
	}
	c := &mpiCall{run: f, done: make(chan error, 1)}
	select {
	case w.reqs <- c:
	case <-w.stopped:
		return &RankError{Rank: w.rank, Op: op, Err: ErrClosed}
	}
	return <-c.done
}

func (w *mpiWorld) refuse(op string) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		return &RankError{Rank: w.rank, Op: op, Err: ErrClosed}
	}
	if w.failed != nil {
		return w.failed
	}
	if w.abortErr != nil {
		return &RankError{Rank: w.rank, Op: "abort", Err: w.abortErr}
	}
	return nil
}

// wait polls the collective in flight until it completes, or the world
// fails (a note, a dead peer, this rank's context, the stall timeout).
// keep are the buffers MPI may still write when the collective is
// abandoned: they are kept referenced and pinned forever. Worker only.
func (w *mpiWorld) wait(ctx context.Context, op string, pin *runtime.Pinner, keep ...any) error {
	t0 := time.Now()
	sleep := time.Duration(0)
	abandon := func(e *RankError) error {
		keepForever(pin, keep)
		if e.Rank == w.rank || e.Rank < 0 {
			w.sendNotes(e)
		}
		return e
	}
	for i := 0; ; i++ {
		var done C.int
		if rc := C.zc_test(&done); rc != 0 {
			return abandon(w.fail(mpiError(op, rc).(*RankError)))
		}
		if done != 0 {
			pin.Unpin()
			return nil
		}
		if i%16 == 15 {
			if f := w.watch(op); f != nil {
				return abandon(f)
			}
			if err := ctx.Err(); err != nil {
				return abandon(w.fail(&RankError{Rank: w.rank, Op: op, Err: err}))
			}
			if st := w.opts.StallTimeout; st > 0 && time.Since(t0) > st {
				return abandon(w.fail(&RankError{Rank: -1, Op: op, Err: fmt.Errorf("%w: rank %d waited %v for the other ranks (MPI cannot tell which rank is missing)", ErrStalled, w.rank, st)}))
			}
		}
		if i >= 64 {
			// Oversubscribed ranks must not spin: the peer this one waits
			// for may need the core.
			sleep = min(max(sleep*2, w.pollBackoff[0]), w.pollBackoff[1])
			time.Sleep(sleep)
		}
	}
}

// start begins a non-blocking collective; an error from MPI fails it.
func (w *mpiWorld) start(op string, rc C.int) error {
	if rc != 0 {
		return w.fail(mpiError(op, rc).(*RankError))
	}
	return nil
}

func (w *mpiWorld) ints(i, n int) []C.int {
	if cap(w.intBufs[i]) < n {
		w.intBufs[i] = make([]C.int, n)
	}
	return w.intBufs[i][:n]
}

func ptr[T any](s []T) unsafe.Pointer {
	if len(s) == 0 {
		return nil
	}
	return unsafe.Pointer(&s[0])
}

func pinAll(p *runtime.Pinner, bufs ...unsafe.Pointer) {
	for _, b := range bufs {
		if b != nil {
			p.Pin(b)
		}
	}
}

func fitsInt(n int) bool { return n <= math.MaxInt32 }

func (w *mpiWorld) AllGather(ctx context.Context, send, recv []byte, counts []int) error {
	total, err := checkCounts("all-gather", counts, w.size)
	if err != nil {
		return err
	}
	if len(send) != counts[w.rank] || len(recv) != total {
		return fmt.Errorf("comm: all-gather: rank %d sends %d bytes (counts say %d) into %d bytes (counts sum to %d)", w.rank, len(send), counts[w.rank], len(recv), total)
	}
	off, _ := Offsets(counts)
	inPlace := len(send) > 0 && &send[0] == &recv[off[w.rank]]
	if total == 0 {
		return nil // every rank has the same counts: none calls MPI
	}
	t0 := time.Now()
	err = w.do(ctx, "all-gather", func() error {
		if !fitsInt(total) {
			return w.gatherByBroadcast(ctx, send, recv, counts, off, inPlace)
		}
		rc, rd := w.ints(0, w.size), w.ints(1, w.size)
		for r := range w.size {
			rc[r], rd[r] = C.int(counts[r]), C.int(off[r])
		}
		var pin runtime.Pinner
		pinAll(&pin, ptr(send), ptr(recv), ptr(rc), ptr(rd))
		ip := C.int(0)
		if inPlace {
			ip = 1
		}
		if err := w.start("all-gather", C.zc_iallgatherv(sendPtr(send), C.int(len(send)), recvPtr(recv), (*C.int)(ptr(rc)), (*C.int)(ptr(rd)), ip)); err != nil {
			pin.Unpin()
			return err
		}
		return w.wait(ctx, "all-gather", &pin, send, recv, rc, rd)
	})
	if err == nil {
		w.count(int64(len(send))*int64(w.size-1), int64(total-len(send)), time.Since(t0))
	}
	return err
}

// gatherByBroadcast is the all-gather of more than 2 GiB (MPI counts are
// 32-bit): each rank's chunk broadcast from it, in pieces. Worker only.
func (w *mpiWorld) gatherByBroadcast(ctx context.Context, send, recv []byte, counts, off []int, inPlace bool) error {
	if !inPlace {
		copy(recv[off[w.rank]:], send)
	}
	const piece = 1 << 30
	for r := range w.size {
		for lo := 0; lo < counts[r]; lo += piece {
			b := recv[off[r]+lo : off[r]+min(counts[r], lo+piece)]
			var pin runtime.Pinner
			pinAll(&pin, ptr(b))
			if err := w.start("all-gather", C.zc_ibcast(recvPtr(b), C.int(len(b)), C.int(r))); err != nil {
				pin.Unpin()
				return err
			}
			if err := w.wait(ctx, "all-gather", &pin, recv); err != nil {
				return err
			}
		}
	}
	return nil
}

func (w *mpiWorld) ReduceScatter(ctx context.Context, send, recv []float32, counts []int) error {
	per := make([]int, w.size)
	for r := range per {
		per[r] = 1
	}
	return w.ReduceScatterMany(ctx, [][]float32{send}, recv, counts, per)
}

func (w *mpiWorld) ReduceScatterMany(ctx context.Context, sends [][]float32, recv []float32, counts, per []int) error {
	total, err := checkMany(sends, recv, counts, per, w.rank, w.size)
	if err != nil {
		return err
	}
	if total == 0 {
		return nil
	}
	t0 := time.Now()
	var sent int64
	if w.opts.NativeReductions {
		err = w.do(ctx, "reduce-scatter", func() error { return w.nativeReduceScatter(ctx, sends, recv, counts) })
		sent = int64(total-counts[w.rank]) * 4
	} else {
		err = w.do(ctx, "reduce-scatter", func() error { return w.orderedReduceScatter(ctx, sends, recv, counts, per) })
		sent = int64(len(sends)) * int64(total-counts[w.rank]) * 4
	}
	if err == nil {
		vectors := 0
		for q, p := range per {
			if q != w.rank {
				vectors += p
			}
		}
		w.count(sent, int64(vectors)*int64(counts[w.rank])*4, time.Since(t0))
	}
	return err
}

// orderedReduceScatter is the bit-exact reduce-scatter: the chunks go
// all-to-all (each rank receives its chunk of every vector), in segments
// of at most segElems elements per chunk, and each rank sums what it
// received in rank order, vector order within a rank. Worker only.
func (w *mpiWorld) orderedReduceScatter(ctx context.Context, sends [][]float32, recv []float32, counts, per []int) error {
	off, _ := Offsets(counts)
	maxc, maxPer, vectors := 0, 0, 0
	for r, c := range counts {
		maxc = max(maxc, c)
		maxPer = max(maxPer, per[r])
		vectors += per[r]
	}
	base := make([]int, w.size) // index of rank r's first vector
	for r := 1; r < w.size; r++ {
		base[r] = base[r-1] + per[r-1]
	}
	S := w.segElems
	mine := counts[w.rank]
	seg := min(S, mine)
	if need := vectors * seg; cap(w.scratch32) < need {
		w.scratch32 = make([]float32, need)
	}
	scratch := w.scratch32[:vectors*seg]
	sc, sd, rc, rd := w.ints(0, w.size), w.ints(1, w.size), w.ints(2, w.size), w.ints(3, w.size)
	for lo := 0; lo < maxc; lo += S {
		m := max(0, min(S, mine-lo)) // this rank's elements in the segment
		for j := range maxPer {
			var src []float32
			if j < per[w.rank] {
				src = sends[j]
			}
			for q := range w.size {
				n := max(0, min(S, counts[q]-lo))
				sc[q], sd[q] = 0, 0
				if src != nil && n > 0 {
					sc[q], sd[q] = C.int(n), C.int(off[q]+lo)
				}
				rc[q], rd[q] = 0, 0
				if j < per[q] && m > 0 {
					rc[q], rd[q] = C.int(m), C.int((base[q]+j)*seg)
				}
			}
			var pin runtime.Pinner
			pinAll(&pin, ptr(src), ptr(scratch), ptr(sc), ptr(sd), ptr(rc), ptr(rd))
			if !fitsInt(len(src)) {
				pin.Unpin()
				return &RankError{Rank: w.rank, Op: "reduce-scatter", Err: fmt.Errorf("a vector of %d elements: MPI displacements are 32-bit", len(src))}
			}
			if err := w.start("reduce-scatter", C.zc_ialltoallv(sendPtr(src), (*C.int)(ptr(sc)), (*C.int)(ptr(sd)), recvPtr(scratch), (*C.int)(ptr(rc)), (*C.int)(ptr(rd)))); err != nil {
				pin.Unpin()
				return err
			}
			if err := w.wait(ctx, "reduce-scatter", &pin, src, scratch, sc, sd, rc, rd); err != nil {
				return err
			}
		}
		if m == 0 {
			continue
		}
		dst := recv[lo : lo+m]
		copy(dst, scratch[:m])
		for v := 1; v < vectors; v++ {
			x := scratch[v*seg : v*seg+m]
			for i := range dst {
				dst[i] = dst[i] + x[i]
			}
		}
		// The scratch belongs to the next segment only after the sum.
	}
	return nil
}

// nativeReduceScatter is MPI_Ireduce_scatter (this rank's vectors summed
// locally first): the library's own order, not bit-exact.
func (w *mpiWorld) nativeReduceScatter(ctx context.Context, sends [][]float32, recv []float32, counts []int) error {
	var src []float32
	switch len(sends) {
	case 0:
		_, total := Offsets(counts)
		src = make([]float32, total) // a rank contributing nothing adds zeros
	case 1:
		src = sends[0]
	default:
		src = append([]float32(nil), sends[0]...)
		for _, s := range sends[1:] {
			for i, x := range s {
				src[i] = src[i] + x
			}
		}
	}
	if !fitsInt(len(src)) {
		return &RankError{Rank: w.rank, Op: "reduce-scatter", Err: fmt.Errorf("a vector of %d elements: MPI counts are 32-bit", len(src))}
	}
	rc := w.ints(0, w.size)
	for q := range w.size {
		rc[q] = C.int(counts[q])
	}
	var pin runtime.Pinner
	pinAll(&pin, ptr(src), ptr(recv), ptr(rc))
	if err := w.start("reduce-scatter", C.zc_ireduce_scatter(sendPtr(src), recvPtr(recv), (*C.int)(ptr(rc)))); err != nil {
		pin.Unpin()
		return err
	}
	return w.wait(ctx, "reduce-scatter", &pin, src, recv, rc)
}

func (w *mpiWorld) AllReduce(ctx context.Context, buf []float32, op Op) error {
	if !op.valid() {
		return fmt.Errorf("comm: all-reduce: unknown operator %v", op)
	}
	return w.allReduce(ctx, unsafe.Slice((*byte)(ptr(buf)), 4*len(buf)), 4, op, func(all []byte) {
		n := len(buf)
		vals := unsafe.Slice((*float32)(ptr(all)), n*w.size)
		for r := 1; r < w.size; r++ {
			x := vals[r*n : (r+1)*n]
			for i := range n {
				if op == Sum {
					vals[i] = vals[i] + x[i]
				} else {
					vals[i] = max32(vals[i], x[i])
				}
			}
		}
		copy(buf, vals[:n])
	})
}

func (w *mpiWorld) AllReduceFloat64(ctx context.Context, buf []float64, op Op) error {
	if !op.valid() {
		return fmt.Errorf("comm: all-reduce: unknown operator %v", op)
	}
	return w.allReduce(ctx, unsafe.Slice((*byte)(ptr(buf)), 8*len(buf)), 8, op, func(all []byte) {
		n := len(buf)
		vals := unsafe.Slice((*float64)(ptr(all)), n*w.size)
		for r := 1; r < w.size; r++ {
			x := vals[r*n : (r+1)*n]
			for i := range n {
				if op == Sum {
					vals[i] = vals[i] + x[i]
				} else if vals[i] != vals[i] || x[i] != x[i] {
					vals[i] = math.NaN()
				} else {
					vals[i] = max(vals[i], x[i])
				}
			}
		}
		copy(buf, vals[:n])
	})
}

// allReduce gathers every rank's buf and reduces in rank order (sum), or
// runs MPI's own all-reduce with NativeReductions.
func (w *mpiWorld) allReduce(ctx context.Context, b []byte, elem int, op Op, reduce func(all []byte)) error {
	if len(b) == 0 {
		return nil
	}
	t0 := time.Now()
	err := w.do(ctx, "all-reduce", func() error {
		if w.opts.NativeReductions {
			var pin runtime.Pinner
			pinAll(&pin, ptr(b))
			dbl, mx := C.int(0), C.int(0)
			if elem == 8 {
				dbl = 1
			}
			if op == Max {
				mx = 1
			}
			if err := w.start("all-reduce", C.zc_iallreduce(recvPtr(b), C.int(len(b)/elem), dbl, mx)); err != nil {
				pin.Unpin()
				return err
			}
			return w.wait(ctx, "all-reduce", &pin, b)
		}
		if !fitsInt(len(b) * w.size) {
			return &RankError{Rank: w.rank, Op: "all-reduce", Err: fmt.Errorf("%d bytes per rank: the rank-ordered all-reduce gathers every rank's buffer, and MPI counts are 32-bit", len(b))}
		}
		// A fresh buffer (float64-aligned) for every rank's values.
		all := make([]float64, (len(b)*w.size+7)/8)
		allB := unsafe.Slice((*byte)(ptr(all)), len(b)*w.size)
		rc, rd := w.ints(0, w.size), w.ints(1, w.size)
		for r := range w.size {
			rc[r], rd[r] = C.int(len(b)), C.int(r*len(b))
		}
		var pin runtime.Pinner
		pinAll(&pin, ptr(b), ptr(all), ptr(rc), ptr(rd))
		if err := w.start("all-reduce", C.zc_iallgatherv(sendPtr(b), C.int(len(b)), recvPtr(allB), (*C.int)(ptr(rc)), (*C.int)(ptr(rd)), 0)); err != nil {
			pin.Unpin()
			return err
		}
		if err := w.wait(ctx, "all-reduce", &pin, b, all, rc, rd); err != nil {
			return err
		}
		reduce(allB)
		return nil
	})
	if err == nil {
		w.count(int64(len(b))*int64(w.size-1), int64(len(b))*int64(w.size-1), time.Since(t0))
	}
	return err
}

func (w *mpiWorld) Broadcast(ctx context.Context, buf []byte, root int) error {
	if root < 0 || root >= w.size {
		return fmt.Errorf("comm: broadcast: root %d is outside the world of %d ranks", root, w.size)
	}
	if len(buf) == 0 {
		return nil
	}
	t0 := time.Now()
	err := w.do(ctx, "broadcast", func() error {
		const piece = 1 << 30
		for lo := 0; lo < len(buf); lo += piece {
			b := buf[lo:min(len(buf), lo+piece)]
			var pin runtime.Pinner
			pinAll(&pin, ptr(b))
			if err := w.start("broadcast", C.zc_ibcast(recvPtr(b), C.int(len(b)), C.int(root))); err != nil {
				pin.Unpin()
				return err
			}
			if err := w.wait(ctx, "broadcast", &pin, buf); err != nil {
				return err
			}
		}
		return nil
	})
	if err == nil {
		if w.rank == root {
			w.count(int64(len(buf))*int64(w.size-1), 0, time.Since(t0))
		} else {
			w.count(0, int64(len(buf)), time.Since(t0))
		}
	}
	return err
}

func (w *mpiWorld) Barrier(ctx context.Context) error {
	t0 := time.Now()
	err := w.do(ctx, "barrier", func() error { return w.barrier(ctx) })
	if err == nil {
		w.count(0, 0, time.Since(t0))
	}
	return err
}

func (w *mpiWorld) barrier(ctx context.Context) error {
	var pin runtime.Pinner
	if err := w.start("barrier", C.zc_ibarrier()); err != nil {
		return err
	}
	return w.wait(ctx, "barrier", &pin)
}

// Abort ends the world: this rank's collectives fail at once, and a
// note carrying err goes to every other rank, whose collectives then
// fail with a *RankError naming this rank (its Err a *RemoteError with
// err's text). A rank that dies without Abort is found by its peers on
// the same host within MPIOptions.LivenessInterval; on other hosts, by
// the stall timeout or the launcher (mpirun ends the job when a process
// exits with an error).
func (w *mpiWorld) Abort(err error) {
	if err == nil {
		err = ErrAborted
	}
	w.mu.Lock()
	if w.failed == nil {
		w.failed = &RankError{Rank: w.rank, Op: "abort", Err: err}
		w.failedAt = time.Now()
		w.abortErr = err
	}
	w.mu.Unlock()
	select {
	case w.kick <- struct{}{}:
	default:
	}
}

// Close leaves the world. Unless the world failed, it is collective:
// every rank's Close meets the others' in a barrier (bounded like any
// collective) and MPI is finalized. After a failure MPI is not
// finalized (a collective may be in flight with a dead rank): Close
// returns once the failure is MPIOptions.FailLinger old — mpirun ends
// every rank as soon as one exits with an error, and the linger lets
// the others report the failure first — and the process should then
// exit with an error status.
func (w *mpiWorld) Close() error {
	w.mu.Lock()
	if w.closed {
		w.mu.Unlock()
		return nil
	}
	w.closed = true
	w.mu.Unlock()
	var err error
	c := &mpiCall{done: make(chan error, 1), run: func() error {
		w.fin = true
		if f := w.watch("close"); f == nil {
			if err := w.barrier(context.Background()); err == nil {
				C.zc_beats_end(w.beatReqs, C.int(w.size))
				rc := C.zc_finalize()
				mpiState.Lock()
				mpiState.finalized = true
				mpiState.Unlock()
				if rc != 0 {
					return fmt.Errorf("comm: MPI_Finalize: %w", mpiError("close", rc))
				}
				return nil
			}
		}
		// Failed. The first rank to exit makes mpirun end the others at
		// once (SIGTERM): linger until the failure is FailLinger old, so
		// that the others have seen it (a note, or a dead peer) and said
		// so, and the notes this rank sent have left.
		w.mu.Lock()
		deadline := w.failedAt.Add(w.opts.FailLinger)
		w.mu.Unlock()
		for time.Now().Before(deadline) {
			if w.notesSent {
				var done C.int
				C.zc_notes_test(w.noteReqs, C.int(w.size), &done)
			}
			time.Sleep(5 * time.Millisecond)
		}
		return nil
	}}
	select {
	case w.reqs <- c:
		err = <-c.done
	case <-w.stopped:
	}
	<-w.stopped
	mpiState.Lock()
	mpiState.open = false
	mpiState.Unlock()
	return err
}

var errFinalized = errors.New("finalized")

// abandoned holds the buffers (and their pins) of collectives abandoned
// in flight when a world failed: MPI may still write them, so they are
// never freed.
var abandoned struct {
	sync.Mutex
	bufs []any
}

func keepForever(v ...any) {
	abandoned.Lock()
	abandoned.bufs = append(abandoned.bufs, v...)
	abandoned.Unlock()
}

// dummies stand in for empty buffers: MPI is never handed a nil
// pointer, and never one pointer for both the send and the receive side
// (Open MPI's non-blocking collectives take equal pointers for
// MPI_IN_PLACE, and a rank alone in that belief runs another protocol
// than its peers: the job hangs).
var dummies = [2]unsafe.Pointer{C.malloc(64), C.malloc(64)}

// sendPtr and recvPtr return a buffer's address for MPI, or a dummy for
// an empty one.
func sendPtr[T any](s []T) unsafe.Pointer {
	if len(s) == 0 {
		return dummies[0]
	}
	return unsafe.Pointer(&s[0])
}

func recvPtr[T any](s []T) unsafe.Pointer {
	if len(s) == 0 {
		return dummies[1]
	}
	return unsafe.Pointer(&s[0])
}

// bare runs a blocking MPI call on the worker, outside the failure
// machinery: for the benchmarks that compare the binding with MPI's own
// collectives in the same job.
func (w *mpiWorld) bare(op string, call func() C.int) error {
	return w.do(context.Background(), op, func() error {
		if rc := call(); rc != 0 {
			return mpiError(op, rc)
		}
		return nil
	})
}

// bareAllGather is MPI_Allgather of equal chunks (len(send) bytes each).
func (w *mpiWorld) bareAllGather(send, recv []byte) error {
	return w.bare("all-gather", func() C.int {
		return C.zc_bare_allgather(sendPtr(send), C.int(len(send)), recvPtr(recv))
	})
}

// bareReduceScatter is MPI_Reduce_scatter_block (MPI's own sum, not
// rank-ordered) of chunks of len(recv) float32.
func (w *mpiWorld) bareReduceScatter(send, recv []float32) error {
	return w.bare("reduce-scatter", func() C.int {
		return C.zc_bare_reduce_scatter_block(sendPtr(send), recvPtr(recv), C.int(len(recv)))
	})
}

// bareAlltoall is MPI_Alltoall of chunks of len(send)/size float32.
func (w *mpiWorld) bareAlltoall(send, recv []float32) error {
	return w.bare("all-to-all", func() C.int {
		return C.zc_bare_alltoall(sendPtr(send), recvPtr(recv), C.int(len(send)/w.size))
	})
}

// nativeReduceScatterOf is the binding's native reduce-scatter (as with
// MPIOptions.NativeReductions) on a world built without it.
func (w *mpiWorld) nativeReduceScatterOf(ctx context.Context, send, recv []float32, counts []int) error {
	return w.do(ctx, "reduce-scatter", func() error { return w.nativeReduceScatter(ctx, [][]float32{send}, recv, counts) })
}

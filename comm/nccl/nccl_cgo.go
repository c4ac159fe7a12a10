//go:build cgo

package nccl

/*
#include <stddef.h>
#include <stdint.h>
#include <string.h>

// The few NCCL types zinf needs, declared here so that no NCCL headers
// are needed to build; they match nccl.h.
typedef int ncclResult_t;
typedef struct { char internal[128]; } ncclUniqueId;
typedef void *ncclComm_t;
typedef void *cudaStream_t;

typedef struct {
	ncclResult_t (*GetVersion)(int *);
	ncclResult_t (*GetUniqueId)(ncclUniqueId *);
	ncclResult_t (*CommInitRank)(ncclComm_t *, int, ncclUniqueId, int);
	ncclResult_t (*CommDestroy)(ncclComm_t);
	ncclResult_t (*CommAbort)(ncclComm_t);
	ncclResult_t (*CommGetAsyncError)(ncclComm_t, ncclResult_t *);
	const char *(*GetErrorString)(ncclResult_t);
	ncclResult_t (*AllGather)(const void *, void *, size_t, int, ncclComm_t, cudaStream_t);
	ncclResult_t (*ReduceScatter)(const void *, void *, size_t, int, int, ncclComm_t, cudaStream_t);
	ncclResult_t (*AllReduce)(const void *, void *, size_t, int, int, ncclComm_t, cudaStream_t);
	ncclResult_t (*Broadcast)(const void *, void *, size_t, int, int, ncclComm_t, cudaStream_t);
	ncclResult_t (*Send)(const void *, size_t, int, int, ncclComm_t, cudaStream_t);
	ncclResult_t (*Recv)(void *, size_t, int, int, ncclComm_t, cudaStream_t);
	ncclResult_t (*GroupStart)(void);
	ncclResult_t (*GroupEnd)(void);
} zinf_nccl_api;

_Static_assert(sizeof(zinf_nccl_api) == 15 * sizeof(void *), "zinf_nccl_api is 15 function pointers");

static ncclResult_t zn_version(zinf_nccl_api *a, int *v) { return a->GetVersion(v); }
static ncclResult_t zn_unique_id(zinf_nccl_api *a, void *out) {
	ncclUniqueId id;
	ncclResult_t rc = a->GetUniqueId(&id);
	memcpy(out, &id, sizeof id);
	return rc;
}
static ncclResult_t zn_init_rank(zinf_nccl_api *a, uintptr_t *comm, int n, const void *id, int rank) {
	ncclUniqueId u;
	memcpy(&u, id, sizeof u);
	ncclComm_t c = NULL;
	ncclResult_t rc = a->CommInitRank(&c, n, u, rank);
	*comm = (uintptr_t)c;
	return rc;
}
static ncclResult_t zn_destroy(zinf_nccl_api *a, uintptr_t c) { return a->CommDestroy((ncclComm_t)c); }
static ncclResult_t zn_abort(zinf_nccl_api *a, uintptr_t c) { return a->CommAbort((ncclComm_t)c); }
static ncclResult_t zn_async_error(zinf_nccl_api *a, uintptr_t c, int *e) {
	ncclResult_t r = 0;
	ncclResult_t rc = a->CommGetAsyncError((ncclComm_t)c, &r);
	*e = r;
	return rc;
}
static const char *zn_error_string(zinf_nccl_api *a, ncclResult_t rc) {
	return a->GetErrorString ? a->GetErrorString(rc) : NULL;
}
static ncclResult_t zn_all_gather(zinf_nccl_api *a, uintptr_t s, uintptr_t r, size_t n, int dt, uintptr_t c, uintptr_t st) {
	return a->AllGather((const void *)s, (void *)r, n, dt, (ncclComm_t)c, (cudaStream_t)st);
}
static ncclResult_t zn_reduce_scatter(zinf_nccl_api *a, uintptr_t s, uintptr_t r, size_t n, int dt, int op, uintptr_t c, uintptr_t st) {
	return a->ReduceScatter((const void *)s, (void *)r, n, dt, op, (ncclComm_t)c, (cudaStream_t)st);
}
static ncclResult_t zn_all_reduce(zinf_nccl_api *a, uintptr_t s, uintptr_t r, size_t n, int dt, int op, uintptr_t c, uintptr_t st) {
	return a->AllReduce((const void *)s, (void *)r, n, dt, op, (ncclComm_t)c, (cudaStream_t)st);
}
static ncclResult_t zn_broadcast(zinf_nccl_api *a, uintptr_t s, uintptr_t r, size_t n, int dt, int root, uintptr_t c, uintptr_t st) {
	return a->Broadcast((const void *)s, (void *)r, n, dt, root, (ncclComm_t)c, (cudaStream_t)st);
}
static ncclResult_t zn_send(zinf_nccl_api *a, uintptr_t b, size_t n, int dt, int peer, uintptr_t c, uintptr_t st) {
	return a->Send((const void *)b, n, dt, peer, (ncclComm_t)c, (cudaStream_t)st);
}
static ncclResult_t zn_recv(zinf_nccl_api *a, uintptr_t b, size_t n, int dt, int peer, uintptr_t c, uintptr_t st) {
	return a->Recv((void *)b, n, dt, peer, (ncclComm_t)c, (cudaStream_t)st);
}
static ncclResult_t zn_group_start(zinf_nccl_api *a) { return a->GroupStart(); }
static ncclResult_t zn_group_end(zinf_nccl_api *a) { return a->GroupEnd(); }
*/
import "C"

import (
	"errors"
	"fmt"
	"unsafe"

	"github.com/zinfio/zinf/accel"
	"github.com/zinfio/zinf/internal/base/dl"
)

// ncclSymbols are NCCL's entry points, in zinf_nccl_api's order.
var ncclSymbols = [...]dl.Symbol{
	{Name: "ncclGetVersion", Required: true},
	{Name: "ncclGetUniqueId", Required: true},
	{Name: "ncclCommInitRank", Required: true},
	{Name: "ncclCommDestroy", Required: true},
	{Name: "ncclCommAbort", Required: true},
	{Name: "ncclCommGetAsyncError", Required: true},
	{Name: "ncclGetErrorString"},
	{Name: "ncclAllGather", Required: true},
	{Name: "ncclReduceScatter", Required: true},
	{Name: "ncclAllReduce", Required: true},
	{Name: "ncclBroadcast", Required: true},
	{Name: "ncclSend", Required: true},
	{Name: "ncclRecv", Required: true},
	{Name: "ncclGroupStart", Required: true},
	{Name: "ncclGroupEnd", Required: true},
}

var (
	_ [unsafe.Sizeof(C.zinf_nccl_api{}) - uintptr(len(ncclSymbols))*unsafe.Sizeof(uintptr(0))]struct{}
	_ [uintptr(len(ncclSymbols))*unsafe.Sizeof(uintptr(0)) - unsafe.Sizeof(C.zinf_nccl_api{})]struct{}
)

// libs loads each NCCL library once per process (never closed: NCCL
// keeps threads).
var libs = dl.NewCache(ncclSymbols[:], func(l *dl.Library) *cgoLib {
	return &cgoLib{path: l.Path(), api: (*C.zinf_nccl_api)(l.Table())}
})

type cgoLib struct {
	path string
	api  *C.zinf_nccl_api
}

func load(path string) (library, error) {
	l, err := libs.Load(path)
	if err != nil {
		var missing *dl.MissingSymbolError
		var open *dl.OpenError
		switch {
		case errors.As(err, &missing):
			return nil, fmt.Errorf("nccl: %s is not a usable NCCL library: it lacks %s (NCCL 2.7 or later is needed): %w", path, missing.Symbol, accel.ErrUnavailable)
		case errors.As(err, &open):
			return nil, fmt.Errorf("nccl: cannot load NCCL %q (install NCCL, e.g. Debian's libnccl2, or set %s to the library's path): %s: %w", path, LibraryEnv, open.Reason, accel.ErrUnavailable)
		}
		return nil, fmt.Errorf("nccl: loading %q: %v: %w", path, err, accel.ErrUnavailable)
	}
	return l, nil
}

func (l *cgoLib) errorOf(call string, code int) error {
	if code == resultSuccess {
		return nil
	}
	msg := "unknown error"
	if s := C.zn_error_string(l.api, C.ncclResult_t(code)); s != nil {
		msg = C.GoString(s)
	}
	return &Error{Call: call, Code: code, Msg: msg}
}

func (l *cgoLib) check(call string, rc C.ncclResult_t) error { return l.errorOf(call, int(rc)) }

func (l *cgoLib) version() (int, error) {
	var v C.int
	err := l.check("ncclGetVersion", C.zn_version(l.api, &v))
	return int(v), err
}

func (l *cgoLib) uniqueID(id []byte) error {
	return l.check("ncclGetUniqueId", C.zn_unique_id(l.api, unsafe.Pointer(&id[0])))
}

func (l *cgoLib) initRank(n int, id []byte, rank int) (uintptr, error) {
	var h C.uintptr_t
	err := l.check("ncclCommInitRank", C.zn_init_rank(l.api, &h, C.int(n), unsafe.Pointer(&id[0]), C.int(rank)))
	return uintptr(h), err
}

func (l *cgoLib) commDestroy(h uintptr) error {
	return l.check("ncclCommDestroy", C.zn_destroy(l.api, C.uintptr_t(h)))
}

func (l *cgoLib) commAbort(h uintptr) error {
	return l.check("ncclCommAbort", C.zn_abort(l.api, C.uintptr_t(h)))
}

func (l *cgoLib) asyncError(h uintptr) (int, error) {
	var e C.int
	err := l.check("ncclCommGetAsyncError", C.zn_async_error(l.api, C.uintptr_t(h), &e))
	return int(e), err
}

func (l *cgoLib) allGather(s, r uintptr, n uint64, dt int, h, st uintptr) error {
	return l.check("ncclAllGather", C.zn_all_gather(l.api, C.uintptr_t(s), C.uintptr_t(r), C.size_t(n), C.int(dt), C.uintptr_t(h), C.uintptr_t(st)))
}

func (l *cgoLib) reduceScatter(s, r uintptr, n uint64, dt, op int, h, st uintptr) error {
	return l.check("ncclReduceScatter", C.zn_reduce_scatter(l.api, C.uintptr_t(s), C.uintptr_t(r), C.size_t(n), C.int(dt), C.int(op), C.uintptr_t(h), C.uintptr_t(st)))
}

func (l *cgoLib) allReduce(s, r uintptr, n uint64, dt, op int, h, st uintptr) error {
	return l.check("ncclAllReduce", C.zn_all_reduce(l.api, C.uintptr_t(s), C.uintptr_t(r), C.size_t(n), C.int(dt), C.int(op), C.uintptr_t(h), C.uintptr_t(st)))
}

func (l *cgoLib) broadcast(s, r uintptr, n uint64, dt, root int, h, st uintptr) error {
	return l.check("ncclBroadcast", C.zn_broadcast(l.api, C.uintptr_t(s), C.uintptr_t(r), C.size_t(n), C.int(dt), C.int(root), C.uintptr_t(h), C.uintptr_t(st)))
}

func (l *cgoLib) send(b uintptr, n uint64, dt, peer int, h, st uintptr) error {
	return l.check("ncclSend", C.zn_send(l.api, C.uintptr_t(b), C.size_t(n), C.int(dt), C.int(peer), C.uintptr_t(h), C.uintptr_t(st)))
}

func (l *cgoLib) recv(b uintptr, n uint64, dt, peer int, h, st uintptr) error {
	return l.check("ncclRecv", C.zn_recv(l.api, C.uintptr_t(b), C.size_t(n), C.int(dt), C.int(peer), C.uintptr_t(h), C.uintptr_t(st)))
}

func (l *cgoLib) group(f func() error) error {
	if err := l.check("ncclGroupStart", C.zn_group_start(l.api)); err != nil {
		return err
	}
	ferr := f()
	// The group is closed even when a call in it failed (NCCL requires
	// balanced calls).
	if err := l.check("ncclGroupEnd", C.zn_group_end(l.api)); ferr == nil {
		ferr = err
	}
	return ferr
}

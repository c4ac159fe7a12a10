// nccl_standin.c: a stand-in for NCCL (libnccl.so.2), built by the tests
// with `gcc -shared -fPIC`, so that zinf's binding runs on every machine.
// It works with the CUDA stand-in (accel/cuda/testdata), whose "device
// memory" is host memory: device pointers are host addresses.
//
// The ranks of a communicator are threads of one process (the tests run
// each rank on its own goroutine, locked to its OS thread). Every
// collective runs when it is called, inside the call: the ranks meet at a
// barrier, each reads the others' buffers, then they meet again; the
// stream is ignored (work is done by the time the call returns).
// Grouped sends and receives (ncclGroupStart/End) run at ncclGroupEnd.
// ncclReduceScatter and ncclAllReduce add in reverse rank order, the last
// rank first: a library is free to choose its order, and this one makes
// results differ from a rank-ordered sum in the last bits.
//
// Environment, read on every call:
//   STANDIN_NCCL_FAIL=name:code[,...]  the named entry point returns the
//                                      ncclResult_t code.
//   STANDIN_NCCL_ASYNC=code            ncclCommGetAsyncError reports code.
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef int ncclResult_t;
typedef struct { char internal[128]; } ncclUniqueId;
typedef struct standin_comm *ncclComm_t;
typedef void *cudaStream_t;

enum { ncclSuccess = 0, ncclUnhandledCudaError = 1, ncclSystemError = 2, ncclInternalError = 3,
       ncclInvalidArgument = 4, ncclInvalidUsage = 5, ncclRemoteError = 6 };
enum { ncclInt8 = 0, ncclUint8 = 1, ncclInt32 = 2, ncclUint32 = 3, ncclInt64 = 4, ncclUint64 = 5,
       ncclFloat16 = 6, ncclFloat32 = 7, ncclFloat64 = 8, ncclBfloat16 = 9 };
enum { ncclSum = 0, ncclProd = 1, ncclMax = 2, ncclMin = 3 };
enum { K_ALLGATHER, K_REDUCE_SCATTER, K_ALLREDUCE, K_BROADCAST, K_GROUP };

#define COMM_MAGIC 0x6e63636c

struct p2p { int send; int peer; void *buf; size_t count; int dtype; };

struct slot {
	int kind, dtype, op, root;
	const void *send;
	void *recv;
	size_t count;
	struct p2p *ops;
	int nops;
};

struct world {
	char id[128];
	int n, joined;
	pthread_mutex_t mu;
	pthread_cond_t cv;
	int arrived;
	unsigned long gen;
	int aborted;
	struct slot *slots;
	struct world *next;
};

struct standin_comm {
	int magic;
	struct world *w;
	int rank;
	int destroyed;
};

static pthread_mutex_t worlds_mu = PTHREAD_MUTEX_INITIALIZER;
static struct world *worlds;
static unsigned long long next_id;

// Per thread: the sends and receives of an open group.
static __thread int group_depth;
static __thread ncclComm_t group_comm;
static __thread struct p2p *group_ops;
static __thread int group_nops, group_cap;

static ncclResult_t injected(const char *fn) {
	const char *spec = getenv("STANDIN_NCCL_FAIL");
	if (spec == NULL) return 0;
	size_t n = strlen(fn);
	for (const char *p = spec; p && *p;) {
		if (strncmp(p, fn, n) == 0 && p[n] == ':') return (ncclResult_t)atoi(p + n + 1);
		p = strchr(p, ',');
		if (p) p++;
	}
	return 0;
}

static size_t dsize(int dt) {
	switch (dt) {
	case ncclInt8: case ncclUint8: return 1;
	case ncclFloat16: case ncclBfloat16: return 2;
	case ncclInt32: case ncclUint32: case ncclFloat32: return 4;
	case ncclInt64: case ncclUint64: case ncclFloat64: return 8;
	}
	return 0;
}

const char *ncclGetErrorString(ncclResult_t r) {
	switch (r) {
	case ncclSuccess: return "no error";
	case ncclUnhandledCudaError: return "unhandled cuda error (stand-in)";
	case ncclSystemError: return "unhandled system error (stand-in)";
	case ncclInternalError: return "internal error (stand-in)";
	case ncclInvalidArgument: return "invalid argument (stand-in)";
	case ncclInvalidUsage: return "invalid usage (stand-in)";
	case ncclRemoteError: return "remote process exited or there was a network error (stand-in)";
	}
	return "unknown result code (stand-in)";
}

ncclResult_t ncclGetVersion(int *v) {
	ncclResult_t rc = injected("ncclGetVersion");
	if (rc) return rc;
	*v = 21903; // 2.19.3
	return ncclSuccess;
}

ncclResult_t ncclGetUniqueId(ncclUniqueId *id) {
	ncclResult_t rc = injected("ncclGetUniqueId");
	if (rc) return rc;
	memset(id, 0, sizeof *id);
	pthread_mutex_lock(&worlds_mu);
	unsigned long long k = ++next_id;
	pthread_mutex_unlock(&worlds_mu);
	memcpy(id->internal, "standin", 7);
	memcpy(id->internal + 8, &k, sizeof k);
	return ncclSuccess;
}

// barrier waits for every rank of w (w->mu held); -1 when the world was
// aborted.
// A real NCCL call queues work and returns, and a rank that never comes
// leaves a kernel spinning; here the calls block, so a barrier gives up
// after STANDIN_NCCL_TIMEOUT_MS (default 30000) and aborts the world.
static int barrier(struct world *w) {
	unsigned long g = w->gen;
	if (w->aborted) return -1;
	if (++w->arrived == w->n) {
		w->arrived = 0;
		w->gen++;
		pthread_cond_broadcast(&w->cv);
		return 0;
	}
	const char *v = getenv("STANDIN_NCCL_TIMEOUT_MS");
	long ms = v && *v ? atol(v) : 30000;
	struct timespec dl;
	clock_gettime(CLOCK_REALTIME, &dl);
	dl.tv_sec += ms / 1000;
	dl.tv_nsec += (ms % 1000) * 1000000L;
	if (dl.tv_nsec >= 1000000000L) { dl.tv_sec++; dl.tv_nsec -= 1000000000L; }
	while (g == w->gen && !w->aborted) {
		if (pthread_cond_timedwait(&w->cv, &w->mu, &dl) != 0 && g == w->gen) {
			w->aborted = 1;
			pthread_cond_broadcast(&w->cv);
		}
	}
	// A barrier that completed before an abort completed: a rank woken
	// late must not see the abort that a faster peer issued after it.
	return g != w->gen ? 0 : -1;
}

ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank) {
	ncclResult_t rc = injected("ncclCommInitRank");
	if (rc) return rc;
	if (nranks < 1 || rank < 0 || rank >= nranks) return ncclInvalidArgument;
	pthread_mutex_lock(&worlds_mu);
	struct world *w = worlds;
	while (w && memcmp(w->id, id.internal, 128) != 0) w = w->next;
	if (w == NULL) {
		w = calloc(1, sizeof *w);
		memcpy(w->id, id.internal, 128);
		w->n = nranks;
		pthread_mutex_init(&w->mu, NULL);
		pthread_cond_init(&w->cv, NULL);
		w->slots = calloc(nranks, sizeof *w->slots);
		w->next = worlds;
		worlds = w;
	}
	pthread_mutex_unlock(&worlds_mu);
	if (w->n != nranks) return ncclInvalidUsage;
	struct standin_comm *c = calloc(1, sizeof *c);
	c->magic = COMM_MAGIC;
	c->w = w;
	c->rank = rank;
	pthread_mutex_lock(&w->mu);
	w->joined++;
	int b = barrier(w); // init is collective
	pthread_mutex_unlock(&w->mu);
	if (b) return ncclRemoteError;
	*comm = c;
	return ncclSuccess;
}

static int valid(ncclComm_t c) { return c && c->magic == COMM_MAGIC && !c->destroyed; }

ncclResult_t ncclCommDestroy(ncclComm_t c) {
	ncclResult_t rc = injected("ncclCommDestroy");
	if (rc) return rc;
	if (!valid(c)) return ncclInvalidArgument;
	c->destroyed = 1;
	return ncclSuccess;
}

ncclResult_t ncclCommAbort(ncclComm_t c) {
	if (c == NULL || c->magic != COMM_MAGIC) return ncclInvalidArgument;
	pthread_mutex_lock(&c->w->mu);
	c->w->aborted = 1;
	pthread_cond_broadcast(&c->w->cv);
	pthread_mutex_unlock(&c->w->mu);
	c->destroyed = 1;
	return ncclSuccess;
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t c, ncclResult_t *err) {
	if (!valid(c)) return ncclInvalidArgument;
	const char *v = getenv("STANDIN_NCCL_ASYNC");
	*err = v && *v ? atoi(v) : ncclSuccess;
	if (*err == ncclSuccess && c->w->aborted) *err = ncclRemoteError;
	return ncclSuccess;
}

// collective runs one collective: rank c->rank's slot s, then work on
// every rank once all have arrived.
static ncclResult_t collective(ncclComm_t c, struct slot s, void (*work)(struct world *, int)) {
	struct world *w = c->w;
	pthread_mutex_lock(&w->mu);
	w->slots[c->rank] = s;
	int b = barrier(w);
	pthread_mutex_unlock(&w->mu);
	if (b) return ncclRemoteError;
	for (int r = 0; r < w->n; r++) {
		if (w->slots[r].kind != s.kind || (s.kind != K_GROUP && (w->slots[r].count != s.count || w->slots[r].dtype != s.dtype))) {
			// Ranks disagree: NCCL would hang or corrupt; the stand-in says so.
			pthread_mutex_lock(&w->mu);
			barrier(w);
			pthread_mutex_unlock(&w->mu);
			return ncclInvalidUsage;
		}
	}
	work(w, c->rank);
	pthread_mutex_lock(&w->mu);
	b = barrier(w);
	pthread_mutex_unlock(&w->mu);
	return b ? ncclRemoteError : ncclSuccess;
}

static void do_allgather(struct world *w, int me) {
	struct slot *s = &w->slots[me];
	size_t b = s->count * dsize(s->dtype);
	for (int r = 0; r < w->n; r++) {
		char *dst = (char *)s->recv + r * b;
		if (dst != w->slots[r].send) memmove(dst, w->slots[r].send, b);
	}
}

// reduce adds (or takes the max of) element i of every rank's src at off,
// the last rank first.
static void reduce(struct world *w, int me, size_t off, void *dst, size_t count) {
	struct slot *s = &w->slots[me];
	if (s->dtype == ncclFloat32) {
		float *d = dst;
		for (size_t i = 0; i < count; i++) {
			float acc = ((const float *)w->slots[w->n - 1].send)[off + i];
			for (int r = w->n - 2; r >= 0; r--) {
				float x = ((const float *)w->slots[r].send)[off + i];
				acc = s->op == ncclMax ? (x > acc ? x : acc) : acc + x;
			}
			d[i] = acc;
		}
	} else {
		double *d = dst;
		for (size_t i = 0; i < count; i++) {
			double acc = ((const double *)w->slots[w->n - 1].send)[off + i];
			for (int r = w->n - 2; r >= 0; r--) {
				double x = ((const double *)w->slots[r].send)[off + i];
				acc = s->op == ncclMax ? (x > acc ? x : acc) : acc + x;
			}
			d[i] = acc;
		}
	}
}

static void do_reduce_scatter(struct world *w, int me) {
	struct slot *s = &w->slots[me];
	reduce(w, me, me * s->count, s->recv, s->count);
}

// All-reduce reads every rank's send while writing this rank's recv: a
// rank reducing in place would change what the others read, so the
// result goes to a scratch copy first.
static void do_allreduce(struct world *w, int me) {
	struct slot *s = &w->slots[me];
	size_t b = s->count * dsize(s->dtype);
	void *tmp = malloc(b ? b : 1);
	reduce(w, me, 0, tmp, s->count);
	pthread_mutex_lock(&w->mu);
	barrier(w); // every rank has read before any writes
	pthread_mutex_unlock(&w->mu);
	memcpy(s->recv, tmp, b);
	free(tmp);
}

static void do_broadcast(struct world *w, int me) {
	struct slot *s = &w->slots[me];
	size_t b = s->count * dsize(s->dtype);
	if (me != s->root) memcpy(s->recv, w->slots[s->root].send, b);
}

static void do_group(struct world *w, int me) {
	struct slot *s = &w->slots[me];
	int used[64] = {0};
	for (int i = 0; i < s->nops; i++) {
		struct p2p *op = &s->ops[i];
		if (op->send) continue;
		// The first unused send of the peer to this rank.
		struct slot *ps = &w->slots[op->peer];
		int k = 0;
		for (int j = 0; j < ps->nops; j++) {
			struct p2p *po = &ps->ops[j];
			if (!po->send || po->peer != me) continue;
			if (k++ < used[op->peer % 64]) continue;
			used[op->peer % 64]++;
			size_t b = op->count * dsize(op->dtype);
			if (po->count == op->count && po->dtype == op->dtype) memmove(op->buf, po->buf, b);
			break;
		}
	}
}

static ncclResult_t check(ncclComm_t c, int dtype) {
	if (!valid(c)) return ncclInvalidArgument;
	if (dsize(dtype) == 0) return ncclInvalidArgument;
	return ncclSuccess;
}

ncclResult_t ncclAllGather(const void *send, void *recv, size_t count, int dtype, ncclComm_t c, cudaStream_t st) {
	ncclResult_t rc = injected("ncclAllGather");
	if (rc || (rc = check(c, dtype))) return rc;
	struct slot s = {.kind = K_ALLGATHER, .dtype = dtype, .send = send, .recv = recv, .count = count};
	return collective(c, s, do_allgather);
}

ncclResult_t ncclReduceScatter(const void *send, void *recv, size_t count, int dtype, int op, ncclComm_t c, cudaStream_t st) {
	ncclResult_t rc = injected("ncclReduceScatter");
	if (rc || (rc = check(c, dtype))) return rc;
	if ((dtype != ncclFloat32 && dtype != ncclFloat64) || (op != ncclSum && op != ncclMax)) return ncclInvalidArgument;
	struct slot s = {.kind = K_REDUCE_SCATTER, .dtype = dtype, .op = op, .send = send, .recv = recv, .count = count};
	return collective(c, s, do_reduce_scatter);
}

ncclResult_t ncclAllReduce(const void *send, void *recv, size_t count, int dtype, int op, ncclComm_t c, cudaStream_t st) {
	ncclResult_t rc = injected("ncclAllReduce");
	if (rc || (rc = check(c, dtype))) return rc;
	if ((dtype != ncclFloat32 && dtype != ncclFloat64) || (op != ncclSum && op != ncclMax)) return ncclInvalidArgument;
	struct slot s = {.kind = K_ALLREDUCE, .dtype = dtype, .op = op, .send = send, .recv = recv, .count = count};
	return collective(c, s, do_allreduce);
}

ncclResult_t ncclBroadcast(const void *send, void *recv, size_t count, int dtype, int root, ncclComm_t c, cudaStream_t st) {
	ncclResult_t rc = injected("ncclBroadcast");
	if (rc || (rc = check(c, dtype))) return rc;
	if (root < 0 || root >= c->w->n) return ncclInvalidArgument;
	struct slot s = {.kind = K_BROADCAST, .dtype = dtype, .root = root, .send = send, .recv = recv, .count = count};
	if (group_depth > 0) {
		// A broadcast inside a group (the all-gather of unequal chunks):
		// a send to every other rank from the root, a receive elsewhere.
		return ncclInvalidUsage;
	}
	return collective(c, s, do_broadcast);
}

static ncclResult_t p2p(const char *fn, int send, void *buf, size_t count, int dtype, int peer, ncclComm_t c) {
	ncclResult_t rc = injected(fn);
	if (rc || (rc = check(c, dtype))) return rc;
	if (peer < 0 || peer >= c->w->n) return ncclInvalidArgument;
	if (group_depth == 0) return ncclInvalidUsage; // the binding always groups them
	if (group_comm && group_comm != c) return ncclInvalidUsage;
	group_comm = c;
	if (group_nops == group_cap) {
		group_cap = group_cap ? 2 * group_cap : 16;
		group_ops = realloc(group_ops, group_cap * sizeof *group_ops);
	}
	group_ops[group_nops++] = (struct p2p){.send = send, .peer = peer, .buf = buf, .count = count, .dtype = dtype};
	return ncclSuccess;
}

ncclResult_t ncclSend(const void *buf, size_t count, int dtype, int peer, ncclComm_t c, cudaStream_t st) {
	return p2p("ncclSend", 1, (void *)buf, count, dtype, peer, c);
}

ncclResult_t ncclRecv(void *buf, size_t count, int dtype, int peer, ncclComm_t c, cudaStream_t st) {
	return p2p("ncclRecv", 0, buf, count, dtype, peer, c);
}

ncclResult_t ncclGroupStart(void) {
	ncclResult_t rc = injected("ncclGroupStart");
	if (rc) return rc;
	group_depth++;
	return ncclSuccess;
}

ncclResult_t ncclGroupEnd(void) {
	ncclResult_t rc = injected("ncclGroupEnd");
	if (rc) return rc;
	if (group_depth == 0) return ncclInvalidUsage;
	if (--group_depth > 0) return ncclSuccess;
	ncclComm_t c = group_comm;
	group_comm = NULL;
	int n = group_nops;
	group_nops = 0;
	if (c == NULL) return ncclSuccess; // an empty group
	struct slot s = {.kind = K_GROUP, .ops = group_ops, .nops = n};
	return collective(c, s, do_group);
}

// cuda_standin.c: a stand-in for the CUDA driver library (libcuda.so.1),
// built by the tests with `gcc -shared -fPIC` so that zinf's bindings run on
// every machine, GPU or not. "Device memory" is page-aligned host memory,
// copies are memcpy, streams are counters.
//
// Environment, read on every call:
//   STANDIN_FAIL=name:code[,name:code...]  make the named entry point return
//                                          the CUresult code (e.g.
//                                          cuInit:100, cuMemAlloc_v2:2).
//   STANDIN_CUDA_DEVICES=n                 devices reported (default 1).
//   STANDIN_CUDA_TOTAL=bytes               memory per device (default 1 GiB).
//   STANDIN_CUDA_STATE=path                after every change, rewrite path
//                                          with "key value" lines: live
//                                          allocations, streams, host
//                                          registrations, retained contexts.
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef struct standin_ctx { int magic; CUdevice dev; } *CUcontext;
typedef struct standin_stream { int magic; int destroyed; } *CUstream;

enum {
	OK = 0, INVALID_VALUE = 1, OUT_OF_MEMORY = 2, NOT_INITIALIZED = 3,
	INVALID_DEVICE = 101, INVALID_CONTEXT = 201, INVALID_HANDLE = 400,
	ALREADY_REGISTERED = 712, NOT_REGISTERED = 713,
};
#define CTX_MAGIC 0x63747821
#define STREAM_MAGIC 0x73747221

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static int initialized;
static struct standin_ctx ctxs[8];
static int retained[8];
static __thread CUcontext current;

struct region { uintptr_t start; size_t len; struct region *next; };
static struct region *allocs, *hostregs;
static long long live_allocs, live_bytes, live_streams, live_hostregs;
static long long total_allocs, total_copies;

static long long env_ll(const char *name, long long def) {
	const char *v = getenv(name);
	return v && *v ? atoll(v) : def;
}

// injected returns the code STANDIN_FAIL sets for fn, or 0.
static CUresult injected(const char *fn) {
	const char *spec = getenv("STANDIN_FAIL");
	if (spec == NULL) return 0;
	size_t n = strlen(fn);
	for (const char *p = spec; p && *p; ) {
		if (strncmp(p, fn, n) == 0 && p[n] == ':') return (CUresult)atoi(p + n + 1);
		p = strchr(p, ',');
		if (p) p++;
	}
	return 0;
}

static void write_state(void) {
	const char *path = getenv("STANDIN_CUDA_STATE");
	if (path == NULL || *path == 0) return;
	FILE *f = fopen(path, "w");
	if (f == NULL) return;
	long long ctx = 0;
	for (int i = 0; i < 8; i++) ctx += retained[i];
	fprintf(f, "allocs %lld\nbytes %lld\nstreams %lld\nhostregs %lld\ncontexts %lld\ntotal_allocs %lld\ncopies %lld\n",
		live_allocs, live_bytes, live_streams, live_hostregs, ctx, total_allocs, total_copies);
	fclose(f);
}

static struct region **find(struct region **list, uintptr_t p) {
	for (; *list; list = &(*list)->next)
		if ((*list)->start == p) return list;
	return NULL;
}

// inside reports whether [p, p+n) lies in one allocation.
static int inside(uintptr_t p, size_t n) {
	for (struct region *r = allocs; r; r = r->next)
		if (p >= r->start && p - r->start <= r->len && n <= r->len - (p - r->start)) return 1;
	return 0;
}

static CUresult need_ctx(void) {
	if (!initialized) return NOT_INITIALIZED;
	if (current == NULL || current->magic != CTX_MAGIC) return INVALID_CONTEXT;
	return OK;
}

CUresult cuInit(unsigned int flags) {
	CUresult rc = injected("cuInit");
	if (rc) return rc;
	if (flags != 0) return INVALID_VALUE;
	pthread_mutex_lock(&mu);
	initialized = 1;
	pthread_mutex_unlock(&mu);
	return OK;
}

CUresult cuDriverGetVersion(int *v) {
	CUresult rc = injected("cuDriverGetVersion");
	if (rc) return rc;
	*v = 12040;
	return OK;
}

CUresult cuDeviceGetCount(int *n) {
	CUresult rc = injected("cuDeviceGetCount");
	if (rc) return rc;
	if (!initialized) return NOT_INITIALIZED;
	*n = (int)env_ll("STANDIN_CUDA_DEVICES", 1);
	return OK;
}

CUresult cuDeviceGet(CUdevice *d, int ordinal) {
	CUresult rc = injected("cuDeviceGet");
	if (rc) return rc;
	if (!initialized) return NOT_INITIALIZED;
	if (ordinal < 0 || ordinal >= env_ll("STANDIN_CUDA_DEVICES", 1) || ordinal >= 8) return INVALID_DEVICE;
	*d = ordinal;
	return OK;
}

CUresult cuDeviceGetName(char *name, int len, CUdevice d) {
	CUresult rc = injected("cuDeviceGetName");
	if (rc) return rc;
	snprintf(name, (size_t)len, "Stand-in GPU %d", d);
	return OK;
}

CUresult cuDeviceTotalMem_v2(size_t *n, CUdevice d) {
	CUresult rc = injected("cuDeviceTotalMem_v2");
	if (rc) return rc;
	(void)d;
	*n = (size_t)env_ll("STANDIN_CUDA_TOTAL", 1LL << 30);
	return OK;
}

CUresult cuDevicePrimaryCtxRetain(CUcontext *c, CUdevice d) {
	CUresult rc = injected("cuDevicePrimaryCtxRetain");
	if (rc) return rc;
	if (!initialized) return NOT_INITIALIZED;
	if (d < 0 || d >= 8) return INVALID_DEVICE;
	pthread_mutex_lock(&mu);
	ctxs[d].magic = CTX_MAGIC;
	ctxs[d].dev = d;
	retained[d]++;
	*c = &ctxs[d];
	write_state();
	pthread_mutex_unlock(&mu);
	return OK;
}

CUresult cuDevicePrimaryCtxRelease_v2(CUdevice d) {
	CUresult rc = injected("cuDevicePrimaryCtxRelease_v2");
	if (rc) return rc;
	if (d < 0 || d >= 8) return INVALID_DEVICE;
	pthread_mutex_lock(&mu);
	rc = retained[d] > 0 ? OK : INVALID_CONTEXT;
	if (rc == OK) retained[d]--;
	write_state();
	pthread_mutex_unlock(&mu);
	return rc;
}

CUresult cuCtxSetCurrent(CUcontext c) {
	CUresult rc = injected("cuCtxSetCurrent");
	if (rc) return rc;
	if (c != NULL && c->magic != CTX_MAGIC) return INVALID_CONTEXT;
	current = c;
	return OK;
}

CUresult cuMemGetInfo_v2(size_t *free, size_t *total) {
	CUresult rc = injected("cuMemGetInfo_v2");
	if (rc || (rc = need_ctx())) return rc;
	pthread_mutex_lock(&mu);
	*total = (size_t)env_ll("STANDIN_CUDA_TOTAL", 1LL << 30);
	*free = *total - (size_t)live_bytes;
	pthread_mutex_unlock(&mu);
	return OK;
}

CUresult cuMemAlloc_v2(CUdeviceptr *p, size_t n) {
	CUresult rc = injected("cuMemAlloc_v2");
	if (rc || (rc = need_ctx())) return rc;
	if (n == 0) return INVALID_VALUE;
	pthread_mutex_lock(&mu);
	if ((long long)n > env_ll("STANDIN_CUDA_TOTAL", 1LL << 30) - live_bytes) {
		pthread_mutex_unlock(&mu);
		return OUT_OF_MEMORY;
	}
	void *mem = NULL;
	struct region *r = malloc(sizeof *r);
	if (r == NULL || posix_memalign(&mem, 4096, n) != 0) {
		free(r);
		pthread_mutex_unlock(&mu);
		return OUT_OF_MEMORY;
	}
	memset(mem, 0, n);
	r->start = (uintptr_t)mem;
	r->len = n;
	r->next = allocs;
	allocs = r;
	live_allocs++;
	live_bytes += (long long)n;
	total_allocs++;
	*p = (CUdeviceptr)(uintptr_t)mem;
	write_state();
	pthread_mutex_unlock(&mu);
	return OK;
}

CUresult cuMemFree_v2(CUdeviceptr p) {
	CUresult rc = injected("cuMemFree_v2");
	if (rc || (rc = need_ctx())) return rc;
	pthread_mutex_lock(&mu);
	struct region **rp = find(&allocs, (uintptr_t)p);
	if (rp == NULL) {
		pthread_mutex_unlock(&mu);
		return INVALID_VALUE;
	}
	struct region *r = *rp;
	*rp = r->next;
	live_allocs--;
	live_bytes -= (long long)r->len;
	free((void *)r->start);
	free(r);
	write_state();
	pthread_mutex_unlock(&mu);
	return OK;
}

CUresult cuStreamCreate(CUstream *s, unsigned int flags) {
	CUresult rc = injected("cuStreamCreate");
	if (rc || (rc = need_ctx())) return rc;
	if (flags > 1) return INVALID_VALUE;
	CUstream st = calloc(1, sizeof *st);
	if (st == NULL) return OUT_OF_MEMORY;
	st->magic = STREAM_MAGIC;
	pthread_mutex_lock(&mu);
	live_streams++;
	write_state();
	pthread_mutex_unlock(&mu);
	*s = st;
	return OK;
}

static CUresult check_stream(CUstream s) {
	return s != NULL && s->magic == STREAM_MAGIC && !s->destroyed ? OK : INVALID_HANDLE;
}

CUresult cuStreamDestroy_v2(CUstream s) {
	CUresult rc = injected("cuStreamDestroy_v2");
	if (rc || (rc = need_ctx()) || (rc = check_stream(s))) return rc;
	// Mark rather than free, so a use after destroy is caught, not a crash.
	s->destroyed = 1;
	pthread_mutex_lock(&mu);
	live_streams--;
	write_state();
	pthread_mutex_unlock(&mu);
	return OK;
}

CUresult cuStreamSynchronize(CUstream s) {
	CUresult rc = injected("cuStreamSynchronize");
	if (rc || (rc = need_ctx()) || (rc = check_stream(s))) return rc;
	return OK;
}

// Copies complete when issued: a stream is always idle.
CUresult cuStreamQuery(CUstream s) {
	CUresult rc = injected("cuStreamQuery");
	if (rc || (rc = need_ctx()) || (rc = check_stream(s))) return rc;
	return OK;
}

static CUresult copy(const char *fn, void *dst, const void *src, size_t n, uintptr_t dev, CUstream s) {
	CUresult rc = injected(fn);
	if (rc || (rc = need_ctx()) || (rc = check_stream(s))) return rc;
	pthread_mutex_lock(&mu);
	int ok = inside(dev, n);
	if (ok) total_copies++;
	pthread_mutex_unlock(&mu);
	if (!ok) return INVALID_VALUE;
	memcpy(dst, src, n);
	return OK;
}

CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void *src, size_t n, CUstream s) {
	return copy("cuMemcpyHtoDAsync_v2", (void *)(uintptr_t)dst, src, n, (uintptr_t)dst, s);
}

CUresult cuMemcpyDtoHAsync_v2(void *dst, CUdeviceptr src, size_t n, CUstream s) {
	return copy("cuMemcpyDtoHAsync_v2", dst, (const void *)(uintptr_t)src, n, (uintptr_t)src, s);
}

CUresult cuMemHostRegister_v2(void *p, size_t n, unsigned int flags) {
	CUresult rc = injected("cuMemHostRegister_v2");
	if (rc || (rc = need_ctx())) return rc;
	if (p == NULL || n == 0 || flags > 0xf) return INVALID_VALUE;
	pthread_mutex_lock(&mu);
	if (find(&hostregs, (uintptr_t)p) != NULL) {
		pthread_mutex_unlock(&mu);
		return ALREADY_REGISTERED;
	}
	struct region *r = malloc(sizeof *r);
	r->start = (uintptr_t)p;
	r->len = n;
	r->next = hostregs;
	hostregs = r;
	live_hostregs++;
	write_state();
	pthread_mutex_unlock(&mu);
	return OK;
}

CUresult cuMemHostUnregister(void *p) {
	CUresult rc = injected("cuMemHostUnregister");
	if (rc || (rc = need_ctx())) return rc;
	pthread_mutex_lock(&mu);
	struct region **rp = find(&hostregs, (uintptr_t)p);
	if (rp == NULL) {
		pthread_mutex_unlock(&mu);
		return NOT_REGISTERED;
	}
	struct region *r = *rp;
	*rp = r->next;
	free(r);
	live_hostregs--;
	write_state();
	pthread_mutex_unlock(&mu);
	return OK;
}

// Names for a few codes only: the bindings must fall back to their own
// table for the rest.
CUresult cuGetErrorName(CUresult rc, const char **s) {
	switch (rc) {
	case OUT_OF_MEMORY: *s = "CUDA_ERROR_OUT_OF_MEMORY"; return OK;
	case INVALID_VALUE: *s = "CUDA_ERROR_INVALID_VALUE"; return OK;
	case 100: *s = "CUDA_ERROR_NO_DEVICE"; return OK;
	}
	return INVALID_VALUE;
}

CUresult cuGetErrorString(CUresult rc, const char **s) {
	switch (rc) {
	case OUT_OF_MEMORY: *s = "out of memory"; return OK;
	case 100: *s = "no CUDA-capable device is detected"; return OK;
	}
	return INVALID_VALUE;
}

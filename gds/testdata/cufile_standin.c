// cufile_standin.c: a stand-in for the cuFile library (libcufile.so.0),
// built by the tests with `gcc -shared -fPIC` so that zinf's GPUDirect
// Storage bindings run on every machine. It pairs with the CUDA stand-in
// (accel/cuda/testdata), whose "device pointers" are host addresses:
// cuFileRead and cuFileWrite are pread and pwrite on the registered file
// descriptor at devPtr_base + devPtr_offset.
//
// Environment, read on every call:
//   STANDIN_FAIL=name:what[,...]  make an entry point fail. For the calls
//                                 returning CUfileError_t, what is the
//                                 CUfileOpError code (cuFileDriverOpen:5001).
//                                 For cuFileRead/cuFileWrite it is an errno
//                                 name (ENOSPC, EIO, EDQUOT, EINVAL: return
//                                 -1 with errno set) or a negative number
//                                 returned as is (-5011).
//   STANDIN_FAIL_AT=offset        with STANDIN_FAIL, fail only the transfers
//                                 whose file range contains offset.
//   STANDIN_SHORT=bytes           move at most this many bytes per transfer
//                                 call (short transfers).
//   STANDIN_EINTR=1               fail every other transfer call with EINTR.
//   STANDIN_DELAY_US=us           sleep this long in every transfer call.
//   STANDIN_REQUIRE_ODIRECT=1     refuse handles on fds without O_DIRECT
//                                 (CU_FILE_DIO_NOT_SET), like GDS proper.
//   STANDIN_CUFILE_STATE=path     after every change, rewrite path with
//                                 "key value" lines: driver opens, live
//                                 handles and buffers, transfer statistics.
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <unistd.h>

typedef struct { int err; int cu_err; } CUfileError_t;
typedef void *CUfileHandle_t;
typedef struct {
	int type;
	union { int fd; void *handle; } handle;
	const void *fs_ops;
} CUfileDescr_t;

enum {
	DRIVER_NOT_INITIALIZED = 5001, CUDA_POINTER_RANGE_ERROR = 5014,
	INVALID_FILE_TYPE = 5018, INVALID_FILE_OPEN_FLAG = 5019, DIO_NOT_SET = 5020, INVALID_VALUE = 5022,
	MEMORY_ALREADY_REGISTERED = 5023, MEMORY_NOT_REGISTERED = 5024,
	HANDLE_NOT_REGISTERED = 5027,
};
#define HANDLE_MAGIC 0x68616e64

// fd is the registered descriptor; bfd, for an O_DIRECT fd, a buffered
// descriptor of the same file for the transfers O_DIRECT cannot do
// (unaligned ones), which real cuFile handles with internal bounce buffers.
struct handle { int magic; int fd; int bfd; };
struct buf { uintptr_t start; size_t len; struct buf *next; };

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static long long driver_opens, live_handles, live_bufs;
static long long calls, max_io, concurrent, max_concurrent, bytes_read, bytes_written, odd;
static struct buf *bufs;

static long long env_ll(const char *name, long long def) {
	const char *v = getenv(name);
	return v && *v ? atoll(v) : def;
}

// failure returns the STANDIN_FAIL value for fn, or NULL.
static const char *failure(const char *fn) {
	const char *spec = getenv("STANDIN_FAIL");
	if (spec == NULL) return NULL;
	size_t n = strlen(fn);
	for (const char *p = spec; p && *p; ) {
		if (strncmp(p, fn, n) == 0 && p[n] == ':') return p + n + 1;
		p = strchr(p, ',');
		if (p) p++;
	}
	return NULL;
}

static CUfileError_t status(int err) {
	CUfileError_t e = {err, 0};
	return e;
}

static CUfileError_t injected(const char *fn) {
	const char *f = failure(fn);
	return status(f ? atoi(f) : 0);
}

static void write_state(void) {
	const char *path = getenv("STANDIN_CUFILE_STATE");
	if (path == NULL || *path == 0) return;
	FILE *f = fopen(path, "w");
	if (f == NULL) return;
	fprintf(f, "driver %lld\nhandles %lld\nbufs %lld\ncalls %lld\nmax_io %lld\nmax_concurrent %lld\nbytes_read %lld\nbytes_written %lld\n",
		driver_opens, live_handles, live_bufs, calls, max_io, max_concurrent, bytes_read, bytes_written);
	fclose(f);
}

CUfileError_t cuFileDriverOpen(void) {
	CUfileError_t e = injected("cuFileDriverOpen");
	if (e.err) return e;
	pthread_mutex_lock(&mu);
	driver_opens++;
	write_state();
	pthread_mutex_unlock(&mu);
	return status(0);
}

CUfileError_t cuFileDriverClose_v2(void) {
	CUfileError_t e = injected("cuFileDriverClose_v2");
	if (e.err) return e;
	pthread_mutex_lock(&mu);
	int err = driver_opens > 0 ? 0 : DRIVER_NOT_INITIALIZED;
	if (!err) driver_opens--;
	write_state();
	pthread_mutex_unlock(&mu);
	return status(err);
}

CUfileError_t cuFileHandleRegister(CUfileHandle_t *fh, CUfileDescr_t *d) {
	CUfileError_t e = injected("cuFileHandleRegister");
	if (e.err) return e;
	if (driver_opens == 0) return status(DRIVER_NOT_INITIALIZED);
	if (d == NULL || fh == NULL || d->fs_ops != NULL) return status(INVALID_VALUE);
	if (d->type != 1) return status(INVALID_FILE_TYPE);
	int flags = fcntl(d->handle.fd, F_GETFL);
	if (flags < 0) return status(INVALID_VALUE);
	if (env_ll("STANDIN_REQUIRE_ODIRECT", 0) && !(flags & O_DIRECT)) return status(DIO_NOT_SET);
	/* cuFile 1.15 refuses O_NOFOLLOW: "fd opened with unsupported flags". */
	if (flags & O_NOFOLLOW) return status(INVALID_FILE_OPEN_FLAG);
	struct handle *h = malloc(sizeof *h);
	h->magic = HANDLE_MAGIC;
	h->fd = d->handle.fd;
	h->bfd = -1;
	if (flags & O_DIRECT) {
		char proc[64];
		snprintf(proc, sizeof proc, "/proc/self/fd/%d", h->fd);
		h->bfd = open(proc, (flags & O_ACCMODE) | O_CLOEXEC);
		if (h->bfd < 0) {
			free(h);
			return status(INVALID_VALUE);
		}
	}
	pthread_mutex_lock(&mu);
	live_handles++;
	write_state();
	pthread_mutex_unlock(&mu);
	*fh = h;
	return status(0);
}

void cuFileHandleDeregister(CUfileHandle_t fh) {
	struct handle *h = fh;
	if (h == NULL || h->magic != HANDLE_MAGIC) return;
	// Kept, not freed, so a use after deregistration is caught.
	h->magic = 0;
	if (h->bfd >= 0) close(h->bfd);
	pthread_mutex_lock(&mu);
	live_handles--;
	write_state();
	pthread_mutex_unlock(&mu);
}

static struct buf **find(uintptr_t p) {
	for (struct buf **b = &bufs; *b; b = &(*b)->next)
		if ((*b)->start == p) return b;
	return NULL;
}

CUfileError_t cuFileBufRegister(const void *p, size_t n, int flags) {
	CUfileError_t e = injected("cuFileBufRegister");
	if (e.err) return e;
	if (driver_opens == 0) return status(DRIVER_NOT_INITIALIZED);
	if (p == NULL || n == 0 || flags != 0) return status(INVALID_VALUE);
	pthread_mutex_lock(&mu);
	if (find((uintptr_t)p)) {
		pthread_mutex_unlock(&mu);
		return status(MEMORY_ALREADY_REGISTERED);
	}
	struct buf *b = malloc(sizeof *b);
	b->start = (uintptr_t)p;
	b->len = n;
	b->next = bufs;
	bufs = b;
	live_bufs++;
	write_state();
	pthread_mutex_unlock(&mu);
	return status(0);
}

CUfileError_t cuFileBufDeregister(const void *p) {
	CUfileError_t e = injected("cuFileBufDeregister");
	if (e.err) return e;
	pthread_mutex_lock(&mu);
	struct buf **bp = find((uintptr_t)p);
	if (bp == NULL) {
		pthread_mutex_unlock(&mu);
		return status(MEMORY_NOT_REGISTERED);
	}
	struct buf *b = *bp;
	*bp = b->next;
	free(b);
	live_bufs--;
	write_state();
	pthread_mutex_unlock(&mu);
	return status(0);
}

static int errno_named(const char *s) {
	static const struct { const char *name; int value; } names[] = {
		{"ENOSPC", ENOSPC}, {"EIO", EIO}, {"EDQUOT", EDQUOT}, {"EINVAL", EINVAL},
		{"EINTR", EINTR}, {"EAGAIN", EAGAIN}, {"EBADF", EBADF},
	};
	for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
		size_t n = strlen(names[i].name);
		if (strncmp(s, names[i].name, n) == 0 && (s[n] == 0 || s[n] == ',')) return names[i].value;
	}
	return 0;
}

static ssize_t transfer(const char *fn, int write, CUfileHandle_t fh, uintptr_t base, size_t size, off_t foff, off_t doff) {
	struct handle *h = fh;
	if (h == NULL || h->magic != HANDLE_MAGIC) return -HANDLE_NOT_REGISTERED;
	if (foff < 0 || doff < 0) return -INVALID_VALUE;

	pthread_mutex_lock(&mu);
	calls++;
	if ((long long)size > max_io) max_io = (long long)size;
	if (++concurrent > max_concurrent) max_concurrent = concurrent;
	int eintr = env_ll("STANDIN_EINTR", 0) && (odd++ % 2 == 0);
	// A registered buffer must contain the whole transfer.
	for (struct buf *b = bufs; b; b = b->next) {
		if (b->start == base && ((size_t)doff > b->len || size > b->len - (size_t)doff)) {
			concurrent--;
			pthread_mutex_unlock(&mu);
			return -CUDA_POINTER_RANGE_ERROR;
		}
	}
	pthread_mutex_unlock(&mu);

	long long delay = env_ll("STANDIN_DELAY_US", 0);
	if (delay > 0) usleep((useconds_t)delay);

	ssize_t ret;
	const char *f = failure(fn);
	long long at = env_ll("STANDIN_FAIL_AT", -1);
	if (eintr) {
		errno = EINTR;
		ret = -1;
	} else if (f != NULL && (at < 0 || (at >= foff && at < foff + (off_t)size))) {
		int e = errno_named(f);
		if (e) {
			errno = e;
			ret = -1;
		} else {
			ret = (ssize_t)atoll(f);
		}
	} else {
		long long short_max = env_ll("STANDIN_SHORT", 0);
		if (short_max > 0 && size > (size_t)short_max) size = (size_t)short_max;
		uintptr_t p = base + (uintptr_t)doff;
		int fd = h->fd;
		if (h->bfd >= 0 && ((p | size | (uintptr_t)foff) & 4095) != 0) fd = h->bfd;
		ret = write ? pwrite(fd, (void *)p, size, foff) : pread(fd, (void *)p, size, foff);
	}
	int saved = errno;

	pthread_mutex_lock(&mu);
	concurrent--;
	if (ret > 0) {
		if (write) bytes_written += ret; else bytes_read += ret;
	}
	write_state();
	pthread_mutex_unlock(&mu);
	errno = saved;
	return ret;
}

ssize_t cuFileRead(CUfileHandle_t fh, void *base, size_t size, off_t foff, off_t doff) {
	return transfer("cuFileRead", 0, fh, (uintptr_t)base, size, foff, doff);
}

ssize_t cuFileWrite(CUfileHandle_t fh, const void *base, size_t size, off_t foff, off_t doff) {
	return transfer("cuFileWrite", 1, fh, (uintptr_t)base, size, foff, doff);
}

//go:build cgo

package dl

/*
#cgo LDFLAGS: -ldl
#include <dlfcn.h>
#include <stdlib.h>

// zinf_dl_load opens path and resolves n symbols into a table of n
// pointers in C memory. On failure it returns NULL with *err set to the
// dlerror text, or *missing set to the index of the first required symbol
// the library lacks. dlerror's text is read in the same C call as the
// dlopen, on the same thread, as its contract requires.
static void **zinf_dl_load(const char *path, char **names, char **fallbacks, const int *required, size_t n,
		const char **err, long *missing) {
	*err = NULL;
	*missing = -1;
	void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
	if (h == NULL) {
		*err = dlerror();
		return NULL;
	}
	void **table = calloc(n > 0 ? n : 1, sizeof *table);
	if (table == NULL) {
		*err = "out of memory";
		dlclose(h);
		return NULL;
	}
	for (size_t i = 0; i < n; i++) {
		void *p = dlsym(h, names[i]);
		if (p == NULL && fallbacks[i] != NULL) {
			p = dlsym(h, fallbacks[i]);
		}
		if (p == NULL && required[i]) {
			*missing = (long)i;
			free(table);
			dlclose(h);
			return NULL;
		}
		table[i] = p;
	}
	return table;
}
*/
import "C"

import (
	"sync"
	"unsafe"
)

// Library is a loaded library and its resolved symbols.
type Library struct {
	path  string
	table unsafe.Pointer // C memory: one pointer per Symbol, never freed
	n     int
}

// Path returns the path the library was loaded from.
func (l *Library) Path() string { return l.path }

// Table returns the resolved entry points: C memory holding one pointer
// per Symbol, in the order given to NewCache (nil for a missing optional
// one). A binding casts it to a C struct of as many function pointers.
func (l *Library) Table() unsafe.Pointer { return l.table }

// Has reports whether the i-th symbol was found.
func (l *Library) Has(i int) bool {
	if i < 0 || i >= l.n {
		return false
	}
	return unsafe.Slice((*unsafe.Pointer)(l.table), l.n)[i] != nil
}

// Cache loads each library path once, resolving one list of symbols, and
// keeps one binding of type T per library (made by wrap), so every caller
// asking for a path gets the same value. Failed loads are not remembered,
// so a library installed later is found. It is safe for concurrent use.
type Cache[T any] struct {
	syms []Symbol
	wrap func(*Library) T
	mu   sync.Mutex
	libs map[string]T
}

// NewCache returns a cache that resolves syms in every library it loads and
// wraps each library with wrap.
func NewCache[T any](syms []Symbol, wrap func(*Library) T) *Cache[T] {
	return &Cache[T]{syms: syms, wrap: wrap, libs: map[string]T{}}
}

// Load returns the binding of the library at path, loading it on first
// use. It fails with an *OpenError or a *MissingSymbolError.
func (c *Cache[T]) Load(path string) (T, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if b, ok := c.libs[path]; ok {
		return b, nil
	}
	var zero T
	n := len(c.syms)
	// The name arrays live in C memory: cgo forbids passing Go memory that
	// holds Go pointers to C.
	words := C.size_t(max(n, 1)) * C.size_t(unsafe.Sizeof(uintptr(0)))
	names := unsafe.Slice((**C.char)(C.calloc(1, words)), max(n, 1))
	fallbacks := unsafe.Slice((**C.char)(C.calloc(1, words)), max(n, 1))
	required := unsafe.Slice((*C.int)(C.calloc(C.size_t(max(n, 1)), C.size_t(unsafe.Sizeof(C.int(0))))), max(n, 1))
	defer func() {
		for i := range n {
			C.free(unsafe.Pointer(names[i]))
			C.free(unsafe.Pointer(fallbacks[i])) // free(NULL) is a no-op
		}
		C.free(unsafe.Pointer(&names[0]))
		C.free(unsafe.Pointer(&fallbacks[0]))
		C.free(unsafe.Pointer(&required[0]))
	}()
	for i, s := range c.syms {
		names[i] = C.CString(s.Name)
		if s.Fallback != "" {
			fallbacks[i] = C.CString(s.Fallback)
		}
		if s.Required {
			required[i] = 1
		}
	}
	cpath := C.CString(path)
	defer C.free(unsafe.Pointer(cpath))
	var cerr *C.char
	var missing C.long
	table := C.zinf_dl_load(cpath, &names[0], &fallbacks[0], &required[0], C.size_t(n), &cerr, &missing)
	if table == nil {
		if missing >= 0 && int(missing) < n {
			return zero, &MissingSymbolError{Path: path, Symbol: c.syms[missing].Name}
		}
		return zero, &OpenError{Path: path, Reason: C.GoString(cerr)}
	}
	b := c.wrap(&Library{path: path, table: unsafe.Pointer(table), n: n})
	c.libs[path] = b
	return b, nil
}

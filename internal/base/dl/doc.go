// Package dl loads a C shared library at run time, once per process, and
// resolves a table of its entry points: the loader the CUDA driver and
// cuFile bindings share. It needs cgo; without it Load fails with
// ErrNoCgo.
//
// A library is never closed: the CUDA driver and libcufile start threads
// and keep state that do not survive dlclose, and a process opens at most
// a handful of libraries.
package dl

import "errors"

// ErrNoCgo: the binary was built without cgo, which dlopen needs.
var ErrNoCgo = errors.New("dl: built without cgo (CGO_ENABLED=0), so no C library can be loaded")

// Symbol is one entry point to resolve. Fallback, when set, is the older
// name tried when Name is missing (the CUDA headers map plain names to
// versioned ones such as cuMemAlloc_v2). A missing Required symbol fails
// the load; a missing optional one leaves a nil entry.
type Symbol struct {
	Name     string
	Fallback string
	Required bool
}

// OpenError reports that dlopen refused the library.
type OpenError struct {
	Path   string
	Reason string // dlerror's text
}

func (e *OpenError) Error() string { return "dl: dlopen " + e.Path + ": " + e.Reason }

// MissingSymbolError reports a library that lacks a required symbol.
type MissingSymbolError struct {
	Path   string
	Symbol string
}

func (e *MissingSymbolError) Error() string {
	return "dl: " + e.Path + " lacks the required symbol " + e.Symbol
}

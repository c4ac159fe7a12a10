// Package testhook marks named points in zinf's work where a crash test
// may stop the process: the checkpoint commit's stages, a training step's
// layers. Tests only: nothing in zinf sets a hook, and with none set Hit is
// one atomic load. A test that runs zinf as a child process sets one there
// (cmd/zinf's tests do it from an environment variable read only by the
// test binary) and kills the child with SIGKILL at the Nth hit of a point,
// so kills land inside the phase they aim at instead of wherever a timer
// happens to fall.
//
// Points are named "<package>/<what>"; the names are part of the tests'
// vocabulary, not of any API.
package testhook

import "sync/atomic"

var hook atomic.Pointer[func(point string)]

// Set installs fn, called by every Hit with the point's name from whatever
// goroutine reaches it, until restore is called. fn must be safe for
// concurrent use. Tests only.
func Set(fn func(point string)) (restore func()) {
	old := hook.Swap(&fn)
	return func() { hook.Store(old) }
}

// Hit reports that the work reached point.
func Hit(point string) {
	if fn := hook.Load(); fn != nil {
		(*fn)(point)
	}
}

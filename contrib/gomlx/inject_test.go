package zgomlx_test

import (
	"bytes"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/zinfio/zinf/aio"
)

// The tests of this module inject I/O faults through the core's public
// seam, aio.Options.Faults (an aio.FaultHook), with the small injector
// below: the core's own injector is internal to the core module, and
// these tests only need to fail or delay the Nth read or write of a swap
// file.

// faultKind selects the ops a faultRule applies to.
type faultKind uint8

const (
	faultAnyOp faultKind = iota
	faultReads
	faultWrites
)

// faultRule is one fault: among the pieces of Kind whose path contains
// PathContains (empty: all), it fires on the Nth (1-based; 0: every one),
// at most Times times (0: no limit), failing the piece with Err and
// sleeping Delay before it.
type faultRule struct {
	Kind         faultKind
	PathContains string
	Nth          int
	Times        int
	Err          syscall.Errno
	Delay        time.Duration

	matched, fired int
}

// injector applies rules to pieces; the engine's workers call Before
// concurrently.
type injector struct {
	mu    sync.Mutex
	rules []*faultRule
	hits  int
}

var _ aio.FaultHook = (*injector)(nil)

func newInjector() *injector { return &injector{} }

// Add appends a rule.
func (in *injector) Add(r faultRule) {
	in.mu.Lock()
	in.rules = append(in.rules, &r)
	in.mu.Unlock()
}

// Clear removes every rule (the space returns, the device heals).
func (in *injector) Clear() {
	in.mu.Lock()
	in.rules = nil
	in.mu.Unlock()
}

// Hits is how many pieces a rule fired on.
func (in *injector) Hits() int {
	in.mu.Lock()
	defer in.mu.Unlock()
	return in.hits
}

// Before implements aio.FaultHook.
func (in *injector) Before(p aio.PieceInfo) aio.Fault {
	in.mu.Lock()
	defer in.mu.Unlock()
	var out aio.Fault
	for _, r := range in.rules {
		switch {
		case r.Kind == faultReads && p.Op != aio.OpRead,
			r.Kind == faultWrites && p.Op != aio.OpWrite,
			!strings.Contains(p.Path, r.PathContains):
			continue
		}
		r.matched++
		if (r.Times > 0 && r.fired >= r.Times) || (r.Nth > 0 && r.matched != r.Nth) {
			continue
		}
		r.fired++
		in.hits++
		if out.Err == 0 {
			out.Err = r.Err
		}
		out.Delay += r.Delay
	}
	return out
}

// syncBuffer is a bytes.Buffer that a logger's goroutines write while the
// test reads it.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

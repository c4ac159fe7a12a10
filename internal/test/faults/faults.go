// Package faults is zinf's fault-injection seam for tests: an Injector
// implements aio.FaultHook and decides, per piece of I/O, whether to fail it
// with an errno (ENOSPC, EIO, EINTR, ...), shorten it, or delay it. Rules
// select pieces by op kind, path substring, offset range and ordinal (the
// Nth matching piece), and a seeded random source makes probabilistic rules
// reproducible: a failing test prints its seed.
//
// Every package above aio uses it the same way: build an Injector, put it
// in aio.Options.Faults, run, then assert on errors with errors.Is and on
// Injector.Hits.
package faults

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/zinfio/zinf/aio"
)

// Kind selects which ops a rule applies to.
type Kind uint8

const (
	// AnyOp matches reads and writes.
	AnyOp Kind = iota
	// Reads matches reads only.
	Reads
	// Writes matches writes only.
	Writes
)

// Rule is one fault. A piece matches when its op fits Kind, its path
// contains PathContains (empty matches all) and, when MaxOffset > 0, its
// offset is in [MinOffset, MaxOffset). Among matching pieces, the rule fires
// on the Nth (1-based; 0 means every one) or, when Probability > 0, at random
// with that probability; it fires at most Times times (0 = unlimited).
type Rule struct {
	Kind         Kind
	PathContains string
	MinOffset    int64
	MaxOffset    int64
	Nth          int
	Probability  float64
	Times        int

	// What happens when it fires (any combination).
	Err      syscall.Errno // fail the piece with this errno
	ShortLen int           // transfer only this many bytes (rounded down to the file's alignment, at least one unit)
	Fraction float64       // or only this fraction of the piece (0 < f < 1)
	Delay    time.Duration // sleep before issuing

	matched int
	fired   int
}

// Injector applies rules to pieces. It is safe for concurrent use.
type Injector struct {
	mu      sync.Mutex
	rules   []*Rule
	rng     *rand.Rand
	seed    uint64
	hits    int
	enabled bool
}

var _ aio.FaultHook = (*Injector)(nil)

// New returns an enabled Injector with the given seed and rules.
func New(seed uint64, rules ...Rule) *Injector {
	in := &Injector{rng: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)), seed: seed, enabled: true}
	for i := range rules {
		r := rules[i]
		in.rules = append(in.rules, &r)
	}
	return in
}

// Seed returns the injector's seed, for failure messages.
func (in *Injector) Seed() uint64 { return in.seed }

// Add appends a rule.
func (in *Injector) Add(r Rule) {
	in.mu.Lock()
	in.rules = append(in.rules, &r)
	in.mu.Unlock()
}

// Clear removes every rule (space "returns", the device heals).
func (in *Injector) Clear() {
	in.mu.Lock()
	in.rules = nil
	in.mu.Unlock()
}

// SetEnabled turns the injector on or off without losing its rules' counts.
func (in *Injector) SetEnabled(on bool) {
	in.mu.Lock()
	in.enabled = on
	in.mu.Unlock()
}

// Hits returns how many pieces a rule has fired on.
func (in *Injector) Hits() int {
	in.mu.Lock()
	defer in.mu.Unlock()
	return in.hits
}

// String describes the injector for test logs.
func (in *Injector) String() string {
	in.mu.Lock()
	defer in.mu.Unlock()
	return fmt.Sprintf("faults.Injector{seed: %d, rules: %d, hits: %d}", in.seed, len(in.rules), in.hits)
}

// Before implements aio.FaultHook.
func (in *Injector) Before(p aio.PieceInfo) aio.Fault {
	in.mu.Lock()
	defer in.mu.Unlock()
	if !in.enabled {
		return aio.Fault{}
	}
	var out aio.Fault
	for _, r := range in.rules {
		if !r.matches(p) {
			continue
		}
		r.matched++
		if r.Times > 0 && r.fired >= r.Times {
			continue
		}
		switch {
		case r.Nth > 0:
			if r.matched != r.Nth {
				continue
			}
		case r.Probability > 0:
			if in.rng.Float64() >= r.Probability {
				continue
			}
		}
		r.fired++
		in.hits++
		if r.Err != 0 && out.Err == 0 {
			out.Err = r.Err
		}
		if n := r.shortLen(p); n > 0 && (out.ShortLen == 0 || n < out.ShortLen) {
			out.ShortLen = n
		}
		out.Delay += r.Delay
	}
	return out
}

func (r *Rule) matches(p aio.PieceInfo) bool {
	switch r.Kind {
	case Reads:
		if p.Op != aio.OpRead {
			return false
		}
	case Writes:
		if p.Op != aio.OpWrite {
			return false
		}
	}
	if r.PathContains != "" && !strings.Contains(p.Path, r.PathContains) {
		return false
	}
	if r.MaxOffset > 0 && (p.Offset < r.MinOffset || p.Offset >= r.MaxOffset) {
		return false
	}
	return true
}

// shortLen returns the shortened length for p, or 0 for no shortening. It
// keeps O_DIRECT alignment, as the kernel would, and never returns the full
// length (that would not be short) or zero (that means EOF).
func (r *Rule) shortLen(p aio.PieceInfo) int {
	n := 0
	switch {
	case r.ShortLen > 0:
		n = r.ShortLen
	case r.Fraction > 0 && r.Fraction < 1:
		n = int(float64(p.Len) * r.Fraction)
	default:
		return 0
	}
	a := max(p.Align, 1)
	n = max(n/a*a, a) // at least one unit: a zero-length transfer reads as EOF
	if n >= p.Len {
		return 0
	}
	return n
}

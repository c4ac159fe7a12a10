package config

import (
	"errors"
	"fmt"
	"strings"
)

// ErrInvalid is matched by every *Error through errors.Is, for callers that
// only need to know that a config was rejected (as opposed to, say, a file
// that could not be read).
var ErrInvalid = errors.New("config: invalid")

// Problem is one thing wrong with a config: a key with a value that has the
// wrong type, is out of range, is not one of the allowed words, conflicts with
// another key, or is not a key at all.
type Problem struct {
	// Key is the dotted path of the offending key, for example
	// "zero_optimization.offload_param.buffer_count". It is empty for
	// problems with the document as a whole (a JSON syntax error).
	Key string
	// Value is the offending value as written in the file (JSON text, so a
	// string keeps its quotes), or as formatted from the Go value when the
	// problem was found by Validate on a Config built in code. It is empty
	// when the problem is not about a value (an unknown key).
	Value string
	// Allowed says what would have been accepted: a list of words, a range,
	// a type. Empty when there is nothing short to say.
	Allowed string
	// Msg says what is wrong, phrased to follow Value: "is not allowed",
	// "is out of range", "unknown key (did you mean ...)".
	Msg string
	// Line and Column locate the problem in the file (1-based; Column counts
	// bytes). Both are 0 when the position is unknown, for example for
	// problems Validate finds on a Config built in code.
	Line, Column int
}

// String renders the problem on one line:
//
//	zero_optimization.offload_param.device: "disk" is not allowed (allowed: none, cpu, nvme)
//
// A problem without a key (a syntax error) is prefixed by its line and
// column instead.
func (p Problem) String() string {
	var b strings.Builder
	switch {
	case p.Key != "":
		b.WriteString(p.Key)
		b.WriteString(": ")
	case p.Line > 0:
		fmt.Fprintf(&b, "line %d, column %d: ", p.Line, p.Column)
	}
	if p.Value != "" {
		b.WriteString(p.Value)
		b.WriteByte(' ')
	}
	b.WriteString(p.Msg)
	if p.Allowed != "" {
		b.WriteString(" (allowed: ")
		b.WriteString(p.Allowed)
		b.WriteByte(')')
	}
	return b.String()
}

// Error is the error returned by Parse, Load and Validate. It lists every
// problem found, not only the first, so that a user fixes a config in one
// round. It matches ErrInvalid under errors.Is.
type Error struct {
	// Source names the file the config came from; empty for Parse of bytes
	// and for Validate.
	Source string
	// Problems holds at least one problem, in the order of the file for
	// problems found while reading it, then in the order of the reference
	// table in the package documentation for those found by Validate.
	Problems []Problem
}

// MaxPrintedProblems bounds the problems Error prints: a file that is not
// a config at all (a JSON file of 400,000 other keys) would otherwise
// print each. Problems holds every one.
const MaxPrintedProblems = 50

// Error lists the problems one per line after a header naming the source
// and their number: the first MaxPrintedProblems, then a line counting the
// rest.
func (e *Error) Error() string {
	var b strings.Builder
	b.WriteString("config: ")
	if e.Source != "" {
		b.WriteString(e.Source)
		b.WriteString(": ")
	}
	switch len(e.Problems) {
	case 0:
		b.WriteString("invalid")
	case 1:
		b.WriteString(e.Problems[0].String())
	default:
		fmt.Fprintf(&b, "%d problems:", len(e.Problems))
		for _, p := range e.Problems[:min(len(e.Problems), MaxPrintedProblems)] {
			b.WriteByte('\n')
			b.WriteString(p.String())
		}
		if rest := len(e.Problems) - MaxPrintedProblems; rest > 0 {
			fmt.Fprintf(&b, "\n... and %d more problems", rest)
		}
	}
	return b.String()
}

// Is reports whether target is ErrInvalid.
func (e *Error) Is(target error) bool { return target == ErrInvalid }

// errorOf returns nil for no problems and an *Error otherwise. It returns
// the error interface so that a nil result is a true nil.
func errorOf(source string, problems []Problem) error {
	if len(problems) == 0 {
		return nil
	}
	return &Error{Source: source, Problems: problems}
}

package config_test

import (
	"bytes"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/zinfio/zinf/config"
	"github.com/zinfio/zinf/internal/test/testenv"
)

// unknownKeys is a config of n unknown keys, {"k0":0,"k1":0,...}: about
// 7 MB for n = 400,000.
func unknownKeys(n int) []byte {
	var b bytes.Buffer
	b.WriteByte('{')
	for i := range n {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, "%q:0", fmt.Sprintf("k%d", i))
	}
	b.WriteByte('}')
	return b.Bytes()
}

// TestManyProblems is the regression for a config with very many
// problems: each problem's line and column was found by rescanning the
// text (quadratic: 50,000 unknown keys took 12 s, 400,000 did not finish
// in 300 s), and every problem was printed. Every problem is still in
// Problems, in file order with its position; the message prints the first
// config.MaxPrintedProblems and counts the rest. The watchdog is generous
// (a linear parse of 100,000 keys takes well under a second, a few under
// the race detector on a loaded machine); BenchmarkParseManyUnknownKeys
// measures 400,000.
func TestManyProblems(t *testing.T) {
	maxPrinted := config.MaxPrintedProblems
	// 100,000 keys took minutes when each position was a rescan and each
	// suggestion built a strings.Replacer per known key; make
	// stress parses the 400,000 of the issue.
	n := testenv.Scale(100_000, 400_000)
	data := unknownKeys(n)
	done := make(chan error, 1)
	go func() { _, err := config.Parse(data); done <- err }()
	var err error
	select {
	case err = <-done:
	case <-time.After(2 * time.Minute):
		t.Fatalf("Parse of %d unknown keys (%d bytes) did not finish in 2 minutes: quadratic again?", n, len(data))
	}
	var ce *config.Error
	if !errors.As(err, &ce) {
		t.Fatalf("Parse = %v, want a *config.Error", err)
	}
	if len(ce.Problems) != n {
		t.Fatalf("%d problems, want %d", len(ce.Problems), n)
	}
	for _, i := range []int{0, 1, n / 2, n - 1} {
		p := ce.Problems[i]
		// {"k0":0,"k1":0,... : key i starts after '{' and i entries.
		col := 2
		for j := range i {
			col += len(`"k":0,`) + len(strconv.Itoa(j))
		}
		if want := fmt.Sprintf("k%d", i); p.Key != want || p.Line != 1 || p.Column != col || !strings.HasPrefix(p.Msg, "unknown key") {
			t.Errorf("problem %d = %+v, want key %s at line 1, column %d", i, p, want, col)
		}
	}
	msg := err.Error()
	lines := strings.Split(msg, "\n")
	if want := 1 + maxPrinted + 1; len(lines) != want {
		t.Fatalf("the message has %d lines, want %d (a header, %d problems, a count of the rest)", len(lines), want, maxPrinted)
	}
	if want := fmt.Sprintf("... and %d more problems", n-maxPrinted); !strings.HasPrefix(lines[len(lines)-1], want) {
		t.Errorf("last line %q, want %q", lines[len(lines)-1], want)
	}
	if !strings.Contains(lines[0], fmt.Sprintf("%d problems", n)) || !strings.HasPrefix(lines[1], "k0: unknown key") {
		t.Errorf("message starts %q, want the total and the first problem", lines[:2])
	}
}

// TestLinePositions: problems on several lines, with CRLF and multi-byte
// text before them, get the line and byte column the whole-text scan
// gave.
func TestLinePositions(t *testing.T) {
	data := "{\r\n  \"é\": 1,\n\n\t\"aio\": {\"queue_depth\": \"x\"},\r\n  \"zinf\": {\"nope\": 1}}"
	_, err := config.Parse([]byte(data))
	var ce *config.Error
	if !errors.As(err, &ce) {
		t.Fatalf("Parse = %v", err)
	}
	want := map[string][2]int{"é": {2, 3}, "aio.queue_depth": {4, 25}, "zinf.nope": {5, 12}}
	for _, p := range ce.Problems {
		w, ok := want[p.Key]
		if !ok {
			t.Errorf("unexpected problem %+v", p)
			continue
		}
		if p.Line != w[0] || p.Column != w[1] {
			t.Errorf("%s at line %d, column %d, want %d, %d", p.Key, p.Line, p.Column, w[0], w[1])
		}
		delete(want, p.Key)
	}
	if len(want) > 0 {
		t.Errorf("missing problems %v", want)
	}
}

// BenchmarkParseManyUnknownKeys: 400,000 unknown keys (7 MB), reported.
func BenchmarkParseManyUnknownKeys(b *testing.B) {
	data := unknownKeys(400_000)
	b.SetBytes(int64(len(data)))
	b.ReportAllocs()
	for b.Loop() {
		_, err := config.Parse(data)
		_ = err.Error()
	}
}

// TestManyKeysAllocations: parsing a config of many keys allocates a
// bounded number of objects, not several per key (json.Decoder's tokens
// took about 15 per key, and the garbage collector's work on them was what
// a loaded machine paid for in wall time: 400,000 keys cost 1.9 s of CPU
// and 3.3-3.7 s of wall at load 8). Nodes come in batches, keys and
// numbers are slices of the text, and problems and members are allocated
// once at their size.
func TestManyKeysAllocations(t *testing.T) {
	allocs := func(n int) float64 {
		data := unknownKeys(n)
		return testing.AllocsPerRun(3, func() {
			if _, err := config.Parse(data); err == nil {
				t.Fatal("unknown keys accepted")
			}
		})
	}
	// The allocations 20,000 more keys add, so that what every parse
	// allocates (the defaults, the key index) does not count.
	small, large := allocs(20_000), allocs(40_000)
	perKey := (large - small) / 20_000
	t.Logf("20,000 unknown keys: %.0f allocations a parse; 40,000: %.0f; %.3f per key", small, large, perKey)
	if perKey > 0.05 {
		t.Fatalf("%.3f allocations per key (%.0f for 20,000 keys, %.0f for 40,000), want at most 0.05", perKey, small, large)
	}
}

package main

import (
	"slices"
	"testing"
)

// TestPieces: a continuation splits into SetByteVocab's pieces, a filler
// token "[tN]" or one byte, so the two systems' texts compare token by
// token.
func TestPieces(t *testing.T) {
	got := pieces("[t12]h[t3][x[t4]")
	want := []string{"[t12]", "h", "[t3]", "[", "x", "[t4]"}
	if !slices.Equal(got, want) {
		t.Fatalf("pieces %q, want %q", got, want)
	}
	if got := pieces("[t1[t]"); !slices.Equal(got, []string{"[", "t", "1", "[", "t", "]"}) {
		t.Fatalf("an unclosed piece splits into %q", got)
	}
}

// TestMedian: the median of an even count is the mean of the middle two;
// min and max are the extremes.
func TestMedian(t *testing.T) {
	v := []float64{4, 1, 3, 2}
	if median(v) != 2.5 || median(v[:3]) != 3 || slicesMin(v) != 1 || slicesMax(v) != 4 {
		t.Fatalf("median %v %v, min %v, max %v", median(v), median(v[:3]), slicesMin(v), slicesMax(v))
	}
}

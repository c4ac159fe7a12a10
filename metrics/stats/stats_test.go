package stats_test

import (
	"slices"
	"testing"

	"github.com/zinfio/zinf/metrics/stats"
)

func TestMedian(t *testing.T) {
	for _, c := range []struct {
		in   []float64
		want float64
	}{
		{nil, 0},
		{[]float64{3}, 3},
		{[]float64{5, 1, 3}, 3},
		{[]float64{4, 1, 3, 2}, 2.5},
		{[]float64{-1, -1, 7, 100}, 3},
	} {
		in := slices.Clone(c.in)
		if got := stats.Median(in); got != c.want {
			t.Errorf("Median(%v) = %v, want %v", c.in, got, c.want)
		}
		if !slices.Equal(in, c.in) {
			t.Errorf("Median reordered its input: %v, was %v", in, c.in)
		}
	}
}

func TestMinMax(t *testing.T) {
	if lo, hi := stats.MinMax(nil); lo != 0 || hi != 0 {
		t.Errorf("MinMax(nil) = %v, %v", lo, hi)
	}
	if lo, hi := stats.MinMax([]float64{2, -3, 9, 4}); lo != -3 || hi != 9 {
		t.Errorf("MinMax = %v, %v; want -3, 9", lo, hi)
	}
}

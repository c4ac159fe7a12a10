// Package stats holds the small summary statistics the benchmarks and
// reports share, so that every figure called a median is computed the same
// way.
package stats

import "slices"

// Median returns the median of v: the middle value of the sorted values,
// or the mean of the middle two for an even count; 0 for none. v is not
// modified.
func Median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	m := len(s) / 2
	if len(s)%2 == 1 {
		return s[m]
	}
	return (s[m-1] + s[m]) / 2
}

// MinMax returns the smallest and largest values of v; 0, 0 for none.
func MinMax(v []float64) (lo, hi float64) {
	if len(v) == 0 {
		return 0, 0
	}
	lo, hi = v[0], v[0]
	for _, x := range v[1:] {
		lo, hi = min(lo, x), max(hi, x)
	}
	return lo, hi
}

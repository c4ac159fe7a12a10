package swapper

import (
	"testing"
	"time"
)

// TestLatencyHistogram puts known latencies into the histogram and checks
// each lands in the bucket its bounds say (bounds inclusive) and the
// quantiles those buckets give.
func TestLatencyHistogram(t *testing.T) {
	var l Latency
	if l.Quantile(0.5) != 0 {
		t.Fatal("an empty histogram has a quantile")
	}
	in := []struct {
		d      time.Duration
		bucket int
	}{
		{0, 0}, {16 * time.Microsecond, 0}, {16*time.Microsecond + 1, 1}, {time.Millisecond, 6}, // 1 ms <= 16 µs << 6 = 1.024 ms
		{time.Second, 16}, {time.Hour, NumLatencyBuckets - 1},
	}
	for _, c := range in {
		l.observe(c.d)
	}
	var want [NumLatencyBuckets]int64
	var sum time.Duration
	for _, c := range in {
		want[c.bucket]++
		sum += c.d
	}
	if l.Buckets != want || l.Count != int64(len(in)) || l.Sum != sum {
		t.Fatalf("histogram %+v, want buckets %v, count %d, sum %v", l, want, len(in), sum)
	}
	for q, w := range map[float64]time.Duration{0.01: 16 * time.Microsecond, 0.5: 32 * time.Microsecond, 0.6: 16 * time.Microsecond << 6,
		0.8: 16 * time.Microsecond << 16, 1: LatencyBounds[len(LatencyBounds)-1]} {
		if got := l.Quantile(q); got != w {
			t.Errorf("quantile %v: %v, want %v", q, got, w)
		}
	}
}

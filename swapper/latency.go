package swapper

import "time"

// NumLatencyBuckets is the number of buckets of a Latency histogram: one
// per bound in LatencyBounds and one above them all.
const NumLatencyBuckets = 22

// LatencyBounds are the inclusive upper bounds of a Latency histogram's
// buckets: powers of two from 16 µs to about 16.8 s, which spans a 4 KiB
// read on a fast NVMe drive to a multi-GiB transfer on a slow disk.
var LatencyBounds = func() (b [NumLatencyBuckets - 1]time.Duration) {
	for i := range b {
		b[i] = (16 * time.Microsecond) << i
	}
	return b
}()

// Latency is a histogram of operation latencies (submission to
// completion). Buckets are not cumulative: Buckets[i] counts latencies
// above LatencyBounds[i-1] (0 for i = 0) and at most LatencyBounds[i];
// the last bucket counts those above every bound.
type Latency struct {
	Count   int64
	Sum     time.Duration
	Buckets [NumLatencyBuckets]int64
}

// observe adds one latency.
func (l *Latency) observe(d time.Duration) {
	l.Count++
	l.Sum += d
	i := 0
	for i < len(LatencyBounds) && d > LatencyBounds[i] {
		i++
	}
	l.Buckets[i]++
}

// Quantile estimates the q-quantile (0 < q <= 1) as the upper bound of the
// bucket it falls in (the largest bound for the last bucket); 0 with no
// observations.
func (l Latency) Quantile(q float64) time.Duration {
	if l.Count == 0 {
		return 0
	}
	rank := int64(q*float64(l.Count) + 0.5)
	rank = min(max(rank, 1), l.Count)
	var seen int64
	for i, n := range l.Buckets {
		if seen += n; seen >= rank {
			return LatencyBounds[min(i, len(LatencyBounds)-1)]
		}
	}
	return LatencyBounds[len(LatencyBounds)-1]
}

// PathStats count the bytes a store moved on one of its paths: what the
// device under it read and wrote, padded to the alignment (the bytes that
// wear an SSD), successful requests only.
type PathStats struct {
	// Path is the directory as given in StoreOptions.Paths.
	Path                    string
	BytesRead, BytesWritten int64
	Reads, Writes           int64
}

package crc32c

// havePrefetch: every amd64 CPU has PREFETCHT0 (SSE).
const havePrefetch = true

// prefetchT0 asks for the cache lines of n bytes from p into every cache
// level, one PREFETCHT0 a line; it neither faults nor waits. Written in
// prefetch_amd64.s.
//
//go:noescape
func prefetchT0(p *byte, n int)

// prefetch asks for b's lines.
func prefetch(b []byte) {
	if len(b) > 0 {
		prefetchT0(&b[0], len(b))
	}
}

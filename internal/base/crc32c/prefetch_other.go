//go:build !amd64

package crc32c

// havePrefetch: no prefetch kernel on this architecture; Update is
// hash/crc32's.
const havePrefetch = false

func prefetch([]byte) {}

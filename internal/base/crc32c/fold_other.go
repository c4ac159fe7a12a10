//go:build !amd64

package crc32c

import "hash/crc32"

// canFold: no folding kernel on this architecture, and haveFold never
// turns on (a var only for the tests' SetFold).
const canFold = false

var haveFold = false

const foldBlock = 128

// foldVPCLMUL is never called here (haveFold is false); it returns what
// the kernel would: the CRC register after b.
func foldVPCLMUL(crc uint32, b []byte) uint32 { return ^crc32.Update(^crc, table, b) }

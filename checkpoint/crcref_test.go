package checkpoint

import "hash/crc32"

// castagnoli is the tests' CRC-32C, from hash/crc32: the reference the
// package's own (internal/base/crc32c) is checked against.
var castagnoli = crc32.MakeTable(crc32.Castagnoli)

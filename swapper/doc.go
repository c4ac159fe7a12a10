// Package swapper holds what zinf's three swappers (param, optimizer, grad)
// share: the Store, which maps a tensor name to extents in a few large swap
// files, one per NVMe path, striped across the paths when there are several
// (software RAID-0), aligned to the device, and optionally checksummed.
//
// Writes are copy-on-write: a tensor's new bytes go to fresh extents and the
// name points at them only once every piece is on disk, so a failed swap-out
// (a full disk, an I/O error) leaves the previous version readable and the
// caller's buffer untouched. Old extents are freed when no read still uses
// them.
//
// Every byte goes through the aio engine. Buffers passed in are pinned pool
// buffers (buffers.Buffer): their capacity covers the tensor rounded up to
// the device alignment, and the store zeroes that padding before writing.
// Scratch files live in a directory the store creates under each path and
// are removed by Close.
package swapper

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
// are removed by Close. The directory holds a lock file the store keeps
// flock'ed while it lives; a process that dies without Close (kill -9, an
// OOM kill) leaves its directory unlocked, and the next OpenStore in that
// path reports and removes it (StoreOptions.KeepStale keeps it; FindStale
// lists such directories without touching them). The directory is made
// under a temporary name with its lock file in it, then renamed; what a
// process killed while making it leaves (no lock file, nothing else in it)
// is removed too once older than IncompleteGrace.
//
// DiskBytes says how much disk a store needs for a set of tensors, an
// upper bound its allocator keeps, and CheckFreeSpace compares that with
// what the paths' filesystems have free.
package swapper

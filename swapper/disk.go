package swapper

import (
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/zinfio/zinf/aio"
	"github.com/zinfio/zinf/config"
)

// CopyOnWriteVersions is how many versions of each tensor the swappers
// keep in a store at once in a training step: the current one and the new
// one being written (param: the staged update until CommitUpdates; grad:
// the write-behind of the next accumulation; optimizer: the "~staged"
// record of every sub-group until the step commits, then "~prev" until it
// is deleted, never three). Add one while a checkpoint pins store versions
// across a step (Store.Pin, as checkpoint.SaveAsync does) or when a
// parameter is staged again before its earlier staged update's write ends.
const CopyOnWriteVersions = 2

// DefaultDiskAlignment is the alignment DiskBytes assumes when it is given
// none, before a store is open to say: 4 KiB, the largest logical block of
// common NVMe drives (and so the largest padding per extent).
const DefaultDiskAlignment = 4096

// PathOverheadBytes is what a store takes on each path beyond its extents:
// the run directory, its lock file, and rounding the swap file up to a
// filesystem block; three blocks, covered for block sizes up to 16 KiB.
const PathOverheadBytes = 64 << 10

// DiskBytes returns how many bytes of free space each of o.Paths must have
// for a store opened with o to hold tensors of the given logical sizes
// (one entry per store key that lives at once: one per parameter or
// gradient partition, one per optimizer sub-group record), with versions
// copies of each (CopyOnWriteVersions; 0 means that) and extents padded to
// alignment (the store's Alignment; 0 means DefaultDiskAlignment). It is an
// upper bound on what the store's files really take: the store's allocator
// never grows a file past versions times the padded extents striped onto
// it (see extentAlloc), and the file is at least o.ReserveBytes long when
// that is set. Paths that share a filesystem each need this much: pass
// them all to CheckFreeSpace, which adds them up.
//
// The bound is tight when every version exists at once (the optimizer
// holds two records of every sub-group until a step commits); the gradient
// store, which writes a few tensors behind at a time, stays nearer one
// copy. Zero and negative sizes take no space.
func (o StoreOptions) DiskBytes(sizes []int64, alignment int64, versions int) int64 {
	var need int64
	for _, b := range o.pathBytes(sizes, alignment, versions) {
		need = max(need, max(b, o.ReserveBytes))
	}
	return need + PathOverheadBytes
}

// pathBytes is, for each of o.Paths (one when there are none), the most
// the allocator lets that path's swap file grow to holding tensors of the
// given sizes with versions copies each: versions times the padded
// extents striped onto the path. Defaults as DiskBytes.
func (o StoreOptions) pathBytes(sizes []int64, alignment int64, versions int) []int64 {
	if alignment <= 0 {
		alignment = DefaultDiskAlignment
	}
	if versions <= 0 {
		versions = CopyOnWriteVersions
	}
	paths := max(len(o.Paths), 1)
	stripe := o.StripeBytes
	if stripe <= 0 {
		stripe = 1 << 20
	}
	stripe = roundUp(stripe, alignment)
	perPath := make([]int64, paths)
	for _, n := range sizes {
		if n <= 0 {
			continue
		}
		padded := roundUp(n, alignment)
		// As Store.extentSizes: stripe k of the tensor goes to path k mod
		// paths; with one path the extent is the padded tensor.
		full := padded / stripe
		rest := padded % stripe
		for p := range perPath {
			chunks := full / int64(paths)
			if int64(p) < full%int64(paths) {
				chunks++
			}
			perPath[p] += chunks * stripe
		}
		if rest > 0 {
			perPath[full%int64(paths)] += rest
		}
	}
	for p := range perPath {
		perPath[p] *= int64(versions)
	}
	return perPath
}

// DiskBytes is StoreOptions.DiskBytes for this store's paths, stripe and
// alignment.
func (s *Store) DiskBytes(sizes []int64, versions int) int64 {
	o := s.opts
	o.StripeBytes = s.stripe
	return o.DiskBytes(sizes, s.align, versions)
}

// SpaceError says that a swap path has less free space than a store needs.
// It matches aio.ErrNoSpace with errors.Is.
type SpaceError struct {
	// Path is the swap path; Shared lists the other paths given on the
	// same filesystem, whose needs were added to it.
	Path   string
	Shared []string
	// NeedBytes is what the paths on this filesystem need together;
	// FreeBytes what it has free for an unprivileged writer.
	NeedBytes, FreeBytes int64
}

func (e *SpaceError) Error() string {
	shared := ""
	if len(e.Shared) > 0 {
		shared = fmt.Sprintf(" (with %s on the same filesystem)", strings.Join(e.Shared, ", "))
	}
	return fmt.Sprintf("swapper: NVMe path %q%s has %s (%d bytes) free, the swap stores need %s (%d bytes): free space there, add NVMe paths, or keep fewer tensors on NVMe",
		e.Path, shared, config.Size(e.FreeBytes), e.FreeBytes, config.Size(e.NeedBytes), e.NeedBytes)
}

// Unwrap makes a SpaceError match aio.ErrNoSpace.
func (e *SpaceError) Unwrap() error { return aio.ErrNoSpace }

// CheckFreeSpace checks that each of paths has needBytes free (DiskBytes),
// counting the paths that share a filesystem together. It returns nil or
// an error naming each short path, the need and the free bytes (a
// *SpaceError per filesystem, joined). A path on a filesystem that does
// not report free space (ramfs) is not checked; a path that cannot be
// examined fails with the reason.
func CheckFreeSpace(paths []string, needBytes int64) error {
	needs := make([]SpaceNeed, len(paths))
	for i, p := range paths {
		needs[i] = SpaceNeed{Path: p, Bytes: needBytes}
	}
	return CheckSpace(needs...)
}

// SpaceNeed is the free space one path must have, for CheckSpace.
type SpaceNeed struct {
	Path  string
	Bytes int64
}

// CheckSpace is CheckFreeSpace for needs that differ per path (several
// stores on different path lists): needs on the same filesystem are added
// up, a path listed twice included.
func CheckSpace(needs ...SpaceNeed) error {
	type fsys struct {
		first      string
		others     []string
		need, free int64
		unreported bool
	}
	var order []uint64
	byDev := map[uint64]*fsys{}
	var errs []error
	for _, n := range needs {
		dev, free, reported, err := freeSpace(n.Path)
		if err != nil {
			errs = append(errs, fmt.Errorf("swapper: free space of NVMe path %q: %w", n.Path, err))
			continue
		}
		f, ok := byDev[dev]
		if !ok {
			f = &fsys{first: n.Path, free: free, unreported: !reported}
			byDev[dev] = f
			order = append(order, dev)
		} else if n.Path != f.first && !containsString(f.others, n.Path) {
			f.others = append(f.others, n.Path)
		}
		f.need += max(n.Bytes, 0)
	}
	for _, dev := range order {
		f := byDev[dev]
		if !f.unreported && f.need > f.free {
			errs = append(errs, &SpaceError{Path: f.first, Shared: f.others, NeedBytes: f.need, FreeBytes: f.free})
		}
	}
	return errors.Join(errs...)
}

func containsString(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// SizingStore returns a Store with o's geometry — paths, stripe,
// checksums, reserve — on a device of the given alignment (0 means
// DefaultDiskAlignment), but without files: its sizing methods
// (Alignment, StripeBytes, PaddedLen, RangeLen, DiskBytes, SpaceNeeds)
// answer as an open store there would, and every I/O fails with
// ErrClosed. Planners use it to size pinned memory and disk before a
// store is opened, or without opening one (`zinf plan`). Engine is not
// needed.
func SizingStore(o StoreOptions, alignment int64) (*Store, error) {
	if len(o.Paths) == 0 {
		return nil, errors.New("swapper: StoreOptions.Paths is empty: give at least one NVMe directory")
	}
	if alignment <= 0 {
		alignment = DefaultDiskAlignment
	}
	if alignment&(alignment-1) != 0 {
		return nil, fmt.Errorf("swapper: alignment %d is not a power of two", alignment)
	}
	if o.StripeBytes == 0 {
		o.StripeBytes = 1 << 20
	}
	if o.StripeBytes < 0 || o.ReserveBytes < 0 {
		return nil, fmt.Errorf("swapper: StripeBytes %d and ReserveBytes %d must not be negative", o.StripeBytes, o.ReserveBytes)
	}
	stripe := roundUp(o.StripeBytes, alignment)
	return &Store{opts: o, tensors: map[string]*version{}, align: alignment, stripe: stripe, unit: checksumUnit(o.ChecksumBytes, stripe, alignment), closed: true}, nil
}

// Sizing returns a sizing store (see SizingStore) with s's geometry and
// an alignment of at least minAlignment: a planner that sizes with it
// gets figures no smaller than s's own, and the same figures for every
// device whose alignment is at most minAlignment.
func (s *Store) Sizing(minAlignment int64) *Store {
	o := s.opts
	o.StripeBytes = s.stripe
	a := max(s.align, minAlignment)
	z, err := SizingStore(o, a)
	if err != nil {
		// s's own geometry is valid; only a minAlignment that is not a
		// power of two gets here.
		z, _ = SizingStore(o, s.align)
	}
	return z
}

// SpaceNeeds returns, per path of the store (in StoreOptions.Paths order),
// the free space it still needs there to hold tensors of the given sizes
// with versions copies each (see DiskBytes): DiskBytes less what its run
// directory already takes on that path (a swap file preallocated with
// ReserveBytes, the lock file). Pass them, with other stores' needs, to
// CheckSpace. A sizing store has no run directory: it needs DiskBytes on
// every path.
func (s *Store) SpaceNeeds(sizes []int64, versions int) []SpaceNeed {
	need := s.DiskBytes(sizes, versions)
	out := make([]SpaceNeed, len(s.opts.Paths))
	for i, p := range s.opts.Paths {
		var taken int64
		if i < len(s.dirs) {
			taken = dirBytes(s.dirs[i])
		}
		out[i] = SpaceNeed{Path: p, Bytes: max(need-taken, 0)}
	}
	return out
}

// Preallocate reserves on each path, with fallocate, the space the
// store's swap file there can grow to while holding tensors of the given
// logical sizes with versions copies each (DiskBytes less the store's own
// small files; 0 versions means CopyOnWriteVersions). Writes into that
// space then neither allocate blocks nor extend the file: on ext4 an
// O_DIRECT write that extends its file completes synchronously under the
// inode's lock, and one into a hole allocates blocks as it goes, both
// slower than an overwrite (the first training step writes every staged
// copy into new space). It also means a training step cannot run out of
// space on the extents the plan counted. Files are never shrunk; a file
// already as long is left alone. Where the filesystem has no fallocate
// the file is only lengthened (aio.File.Allocate). An error names the path
// and the bytes.
func (s *Store) Preallocate(sizes []int64, versions int) error {
	o := s.opts
	o.StripeBytes = s.stripe
	want := o.pathBytes(sizes, s.align, versions)
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return ErrClosed
	}
	for i, f := range s.files {
		if i >= len(want) || want[i] <= 0 {
			continue
		}
		have, err := f.Size()
		if err != nil {
			return fmt.Errorf("swapper: preallocating the swap file on %s: %w", o.Paths[i], err)
		}
		if have >= want[i] {
			continue
		}
		if err := f.Allocate(want[i]); err != nil {
			return fmt.Errorf("swapper: preallocating %s (%d bytes) for the swap file on %s: %w", config.Size(want[i]), want[i], o.Paths[i], err)
		}
	}
	return nil
}

// dirBytes is the disk space dir and the files directly in it take (run
// directories are flat). What cannot be examined counts as nothing.
func dirBytes(dir string) int64 {
	var total int64
	if fi, err := os.Lstat(dir); err == nil {
		total += allocatedBytes(fi)
	}
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		if fi, err := e.Info(); err == nil {
			total += allocatedBytes(fi)
		}
	}
	return total
}

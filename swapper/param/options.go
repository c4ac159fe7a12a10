package param

import (
	"errors"
	"fmt"
	"log/slog"

	"github.com/zinfio/zinf/accel"
	"github.com/zinfio/zinf/buffers"
	"github.com/zinfio/zinf/gds"
	"github.com/zinfio/zinf/swapper"
)

// Options configure a Swapper. Zero fields take the documented defaults
// (EnsureDefaults); Validate reports every problem at once.
type Options struct {
	// Store is the NVMe tier. Required when any tensor is registered
	// TierNVMe (Register fails otherwise); nil is fine without one.
	Store *swapper.Store
	// Pool provides the pinned working buffers (purpose params; staging for
	// device copies). Required.
	Pool *buffers.Pool
	// Device is the GPU tier. Required when any tensor is registered
	// TierGPU; nil is fine without one.
	Device accel.Device
	// Rank and WorldSize select this rank's partition of every tensor
	// (see Partition). Defaults 0 and 1; 0 <= Rank < WorldSize.
	Rank, WorldSize int
	// DType is the element type of parameters in memory and on disk.
	// Default swapper.Float32.
	DType swapper.DType
	// MaxInCPUBytes is DeepSpeed's max_in_cpu: the bytes of released NVMe
	// partitions kept in pinned pool memory (a ristretto cache in front of
	// NVMe). Default 0: no cache. At most the pool's capacity.
	MaxInCPUBytes int64
	// CacheKeep, when set, admits to the CPU cache only the partitions it
	// accepts (by tensor name): a fixed set chosen for passes that use
	// every partition once each time (inference: policy.SpreadCache),
	// where which partitions stay matters and how recently they were used
	// does not. Default nil: any released partition may enter.
	CacheKeep func(name string) bool
	// PieceBytes, when > 0, moves every NVMe partition larger than it in
	// pieces of at most PieceBytes (a multiple of the store's PieceUnit):
	// such a partition is streamed, never swapped in whole — Prefetch,
	// Wait and Release pass it by; ReadFloat32, ReadBytes, ReadAs and
	// ReadSpansAs read the parts they need straight from the store through
	// one pool buffer of at most PieceBytes — and Init, StageUpdate and
	// StageRange write it piece by piece. Its pinned need is one piece,
	// not the partition. Ignored with DeviceIO. Default 0: every partition
	// moves whole.
	PieceBytes int64
	// BufferCount is DeepSpeed's buffer_count: the most NVMe partitions
	// swapped in (resident or in flight) at once. Default 0: bounded only by
	// the pool. Swap-ins beyond it wait for a Release; they never fail for
	// it.
	BufferCount int
	// DeviceIO, when set, makes NVMe partitions swap into device memory
	// instead of pinned host buffers (DeepSpeed's use_gds for parameters):
	// a swap-in allocates the padded partition on Device and reads it from
	// the swap files with DeviceIO (GPUDirect Storage, or the bounce path
	// through pinned staging buffers), and ReadFloat32 copies it device ->
	// host. It must have been built over Device. Caveats: the store's
	// checksums are not verified on these swap-ins (the bytes do not pass
	// through host memory; writes still record them), the CPU cache
	// (MaxInCPUBytes) holds no device copies, and a full device is
	// backpressure while swapped-in partitions may be released, else an
	// error. Default nil: pinned host buffers.
	DeviceIO gds.DeviceIO
	// KeyPrefix prefixes every tensor name to form its store key, so that
	// several swappers can share one store. Default "" (the key is the
	// name).
	KeyPrefix string
	// Logger receives warnings. Default slog.Default().
	Logger *slog.Logger
}

// EnsureDefaults fills the zero fields of o with their defaults.
func (o *Options) EnsureDefaults() {
	if o.WorldSize == 0 {
		o.WorldSize = 1
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
}

// Validate reports every invalid field, joined; each names the field, its
// value and what is allowed.
func (o *Options) Validate() error {
	var errs []error
	bad := func(field string, v any, allowed string) {
		errs = append(errs, fmt.Errorf("param: Options.%s = %v: %s", field, v, allowed))
	}
	if o.Pool == nil {
		bad("Pool", nil, "required (the pinned working buffers)")
	}
	if o.WorldSize < 0 {
		bad("WorldSize", o.WorldSize, "must be >= 1 (0 means 1)")
	}
	if o.Rank < 0 || (o.WorldSize > 0 && o.Rank >= o.WorldSize) || (o.WorldSize == 0 && o.Rank > 0) {
		bad("Rank", o.Rank, fmt.Sprintf("must be in [0, WorldSize) (WorldSize %d)", max(o.WorldSize, 1)))
	}
	switch o.DType {
	case swapper.Float32, swapper.BFloat16, swapper.Float16:
	default:
		bad("DType", int(o.DType), "must be swapper.Float32, BFloat16 or Float16")
	}
	if o.MaxInCPUBytes < 0 {
		bad("MaxInCPUBytes", o.MaxInCPUBytes, "must be >= 0 (0 means no CPU cache)")
	} else if o.Pool != nil && o.MaxInCPUBytes > o.Pool.CapacityBytesFor(buffers.PurposeParams) {
		bad("MaxInCPUBytes", o.MaxInCPUBytes, fmt.Sprintf("must not exceed the pool's memory for parameters (%d bytes): the cache lives in pool memory", o.Pool.CapacityBytesFor(buffers.PurposeParams)))
	}
	if o.DeviceIO != nil && o.Device == nil {
		bad("DeviceIO", o.DeviceIO.Mode(), "needs Device, the device it moves bytes to")
	}
	if o.PieceBytes < 0 {
		bad("PieceBytes", o.PieceBytes, "must be >= 0 (0 means partitions move whole)")
	} else if o.PieceBytes > 0 && o.Store != nil && o.PieceBytes%o.Store.PieceUnit() != 0 {
		bad("PieceBytes", o.PieceBytes, fmt.Sprintf("must be a multiple of the store's piece unit (%d bytes)", o.Store.PieceUnit()))
	}
	if o.BufferCount < 0 {
		bad("BufferCount", o.BufferCount, "must be >= 0 (0 means bounded only by the pool)")
	}
	return errors.Join(errs...)
}

// Partition returns rank's element range [lo, hi) of a tensor of numel
// elements split over world ranks, as ZeRO-3 does: every rank gets
// ceil(numel/world) elements except the last ones, which get what is left
// (possibly nothing).
func Partition(numel, rank, world int) (lo, hi int) {
	if world <= 0 || numel <= 0 || rank < 0 {
		return 0, 0
	}
	chunk := (numel + world - 1) / world
	lo = min(rank*chunk, numel)
	hi = min(lo+chunk, numel)
	return lo, hi
}

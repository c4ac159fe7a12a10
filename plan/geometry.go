package plan

import "github.com/zinfio/zinf/swapper"

// ParamChecksumBytes is the bytes one checksum covers in the parameter
// swap store (with zinf.checksums; swapper.StoreOptions.ChecksumBytes):
// reading a few rows of a streamed tensor reads and verifies 16 KiB
// around each, not the 1 MiB stripe. The gradient and optimizer stores
// checksum a sub-group's gradient bytes at most (SubGroupChecksumBytes).
const ParamChecksumBytes = 16 << 10

// StoreGeometry is what a plan reads of one swap store: its options (the
// NVMe paths, the stripe, the checksum span, the bytes reserved per file)
// and the alignment its transfers are padded to. It is a value: computing
// it opens nothing, and zinf.Open opens the store from these options after
// planning.
type StoreGeometry struct {
	Options   swapper.StoreOptions
	Alignment int64
}

// Geometry is the swap stores' geometry a plan sizes pinned memory and
// disk with; a store is nil where the config keeps that state in memory.
// The gradient store has the optimizer store's options.
type Geometry struct {
	Param, Grad, Optim *StoreGeometry
}

// GeometryOf is the geometry of the swap stores the settings ask for, at
// swapper.DefaultDiskAlignment (4 KiB): the figures then hold on every
// device whose alignment is at most that, and zinf.Open refuses a store
// whose device needs more (see zinf.Open).
func GeometryOf(s *Settings) Geometry {
	var g Geometry
	if s.ParamStore.Paths != nil {
		g.Param = &StoreGeometry{Options: s.ParamStore, Alignment: swapper.DefaultDiskAlignment}
	}
	if s.OptimStore.Paths != nil {
		g.Optim = &StoreGeometry{Options: s.OptimStore, Alignment: swapper.DefaultDiskAlignment}
		g.Grad = g.Optim
	}
	return g
}

// AlignmentBytes is the alignment the plan sizes the store's transfers
// for: g's, at least swapper.DefaultDiskAlignment.
func (g *StoreGeometry) AlignmentBytes() int64 {
	return max(g.Alignment, swapper.DefaultDiskAlignment)
}

// sizing is the sizing store (swapper.SizingStore: no files) of g's
// geometry; nil for nil.
func (g *StoreGeometry) sizing() (*swapper.Store, error) {
	if g == nil {
		return nil, nil
	}
	return swapper.SizingStore(g.Options, g.AlignmentBytes())
}

// sizing is the sizing stores of g's geometry.
func (g Geometry) sizing() (param, grad, optim *swapper.Store, err error) {
	if param, err = g.Param.sizing(); err != nil {
		return nil, nil, nil, err
	}
	if grad, err = g.Grad.sizing(); err != nil {
		return nil, nil, nil, err
	}
	if optim, err = g.Optim.sizing(); err != nil {
		return nil, nil, nil, err
	}
	return param, grad, optim, nil
}

package zinf

// Open's swap stores: opened by build from the plan's geometry, after
// planning, and held to it.

import (
	"fmt"

	"github.com/zinfio/zinf/aio"
	"github.com/zinfio/zinf/plan"
	"github.com/zinfio/zinf/swapper"
	"github.com/zinfio/zinf/trace"
)

// ParamChecksumBytes is the bytes one checksum covers in the parameter
// swap store (with zinf.checksums; swapper.StoreOptions.ChecksumBytes):
// reading a few rows of a streamed tensor (ReadParamRows) reads and
// verifies 16 KiB around each, not the 1 MiB stripe. The gradient and
// optimizer stores checksum a sub-group's gradient bytes at most
// (plan.SubGroupChecksumBytes); the others each stripe.
const ParamChecksumBytes = plan.ParamChecksumBytes

// openStores starts the timeline (Options.Trace), which the stores record
// into, and opens the I/O engine (unless Options.Engine gives one, else
// with Options.Faults) and the swap stores of the plan's geometry g, on
// it (creating their run directories and swap files, with the bytes
// zinf.swap_file_bytes reserves). A store whose device needs a larger
// alignment than g's is refused: the plan's pinned buffers and disk
// figures would be short for its transfers.
func (r *Runtime) openStores(g plan.Geometry, s *plan.Settings, engine aio.Engine, faults aio.FaultHook, sink trace.Sink) (err error) {
	r.trace.init(sink, r.Rank, len(r.model.Layers))
	if r.Engine = engine; r.Engine == nil {
		eo := s.Engine
		eo.Faults, eo.Logger = faults, r.log
		r.Engine, err = aio.New(eo)
		if err != nil {
			return fmt.Errorf("zinf: I/O engine: %w", err)
		}
		r.ownEngine = true
	}
	warnRAMPaths(s.NVMePaths, r.log)
	// openStore opens the swap store name ("param", "optim" or "grad") of
	// geometry sg, on the runtime's engine, recording into its timeline.
	openStore := func(name string, sg *plan.StoreGeometry) (*swapper.Store, error) {
		o := sg.Options
		o.Engine, o.Name, o.Logger, o.Trace = r.Engine, fmt.Sprintf("%s-rank%d", name, r.Rank), r.log, r.trace.store(name)
		st, err := swapper.OpenStore(o)
		if err != nil {
			return nil, fmt.Errorf("zinf: %s swap store: %w", name, err)
		}
		if a := st.Alignment(); a > sg.AlignmentBytes() {
			err := fmt.Errorf("zinf: %s swap store: the device of %v needs transfers aligned to %d bytes, more than the %d the plan sizes pinned buffers and disk for", name, o.Paths, a, sg.AlignmentBytes())
			if cerr := st.Close(); cerr != nil {
				err = fmt.Errorf("%w (and closing the store: %v)", err, cerr)
			}
			return nil, err
		}
		return st, nil
	}
	if g.Param != nil {
		if r.ParamStore, err = openStore("param", g.Param); err != nil {
			return err
		}
	}
	if g.Optim != nil {
		if r.OptimStore, err = openStore("optim", g.Optim); err != nil {
			return err
		}
		if r.GradStore, err = openStore("grad", g.Grad); err != nil {
			return err
		}
	}
	return nil
}

package zgomlx

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/gomlx/gomlx/core/tensors"
)

// Row reads of a lookup (Layer.Lookups): a streamed embedding table is
// read at the rows the batch's ids name, into those rows of its swap-in
// buffer (the graph Gathers only them), and its own layer's gradient is
// handed over for those rows alone. The rows are sorted and unique, so
// the gradient of a row used several times is the one the graph summed
// (its Gather's scatter-add, in the ids' order), and zinf adds every
// row's gradient as AccumulateGrad of the whole table would: bit for bit
// the same.

// byRows reports whether v is read by rows in this pass: a lookup that
// zinf streams.
func (s *zinfSource) byRows(v *Var) bool { return v.lookup >= 0 && s.off.rt.Streamed(v.Name) }

// lookupRows returns the sorted, unique rows v's ids name in the run in
// progress (a slice of the Trainer's, valid until the next call): in
// every micro-batch of a layer-major step when all is set (a swap-in),
// else in the batch whose gradient is handed over.
func (s *zinfSource) lookupRows(v *Var, all bool) ([]int, error) {
	sets := [][]*tensors.Tensor{s.ex.inputs}
	if all && s.ex.batches != nil {
		sets = s.ex.batches
	}
	rows := s.rows[:0]
	for _, in := range sets {
		if v.lookup >= len(in) {
			return nil, fmt.Errorf("zgomlx: lookup %q reads its rows from input %d; the batch has %d inputs", v.Name, v.lookup, len(in))
		}
		var err error
		if rows, err = idsOf(s.ex.backend, in[v.lookup], rows); err != nil {
			return nil, fmt.Errorf("zgomlx: lookup %q: input %d: %w", v.Name, v.lookup, err)
		}
	}
	slices.Sort(rows)
	rows = slices.Compact(rows)
	s.rows = rows
	return rows, nil
}

// readRows reads the rows of v the batch uses into its slot, which then
// holds no whole version (slot.version 0) but those rows of the current
// one (slot.rows, slot.rowsVersion). When the slot already holds them (a
// layer-major step's backward pass binds the lookup's layer again, for
// the rows its forward pass read) nothing is read: the lookup's backward
// gets the same bytes, and the table's pieces that hold those rows (read
// whole, PieceBytes each) are not read a second time a step. It reports
// whether it read.
func (s *zinfSource) readRows(ctx context.Context, v *Var) (bool, error) {
	rows, err := s.lookupRows(v, true)
	if err != nil {
		return false, err
	}
	if sl := v.slot; sl.owner == v && sl.rowsVersion == s.off.version && slices.Equal(sl.rows, rows) {
		return false, nil
	}
	rl := s.off.rt.RowLen(v.Name)
	rb := rl * v.dtype.Size()
	need := len(rows) * rb
	if cap(s.rowBytes) < need {
		s.rowBytes = make([]byte, need)
	}
	buf := s.rowBytes[:need]
	if err := s.off.rt.ReadParamRows(ctx, v.Name, rows, v.dtype, buf); err != nil {
		return false, err
	}
	// The graph reads only these rows: the rows earlier passes wrote need
	// not stay in RAM (a table's buffer would otherwise fill up with the
	// rows of every batch, and with whatever its allocation left there).
	dropPages(v.slot.bytes)
	for i, r := range rows {
		copy(v.slot.bytes[r*rb:(r+1)*rb], buf[i*rb:(i+1)*rb])
	}
	v.slot.version = 0
	v.slot.rows = append(v.slot.rows[:0], rows...)
	v.slot.rowsVersion = s.off.version
	s.bytesRead += int64(need)
	return true, nil
}

// readWhole reads all of v into its slot (a borrowed lookup, whose own
// layer read only rows): in pieces straight into the buffer.
func (s *zinfSource) readWhole(ctx context.Context, v *Var) error {
	if err := s.off.rt.ReadParamRange(ctx, v.Name, 0, v.numel, v.dtype, v.slot.bytes); err != nil {
		return err
	}
	v.slot.version = s.off.version
	s.bytesRead += int64(len(v.slot.bytes))
	return nil
}

// gradRows hands over the rows of g (v's whole gradient, zero elsewhere)
// the batch uses.
func (s *zinfSource) gradRows(ctx context.Context, v *Var, g []float32) error {
	rows, err := s.lookupRows(v, false)
	if err != nil {
		return err
	}
	rl := s.off.rt.RowLen(v.Name)
	need := len(rows) * rl
	if cap(s.rowGrad) < need {
		s.rowGrad = make([]float32, need)
	}
	out := s.rowGrad[:need]
	for i, r := range rows {
		copy(out[i*rl:(i+1)*rl], g[r*rl:(r+1)*rl])
	}
	if he := s.ex.head; he.holds(v) {
		// A layer-major step's head gradient of these rows waits here
		// (headHold): the rest of g is zero, the graph's scatter-add of
		// the ids' rows into a zero table.
		done, err := he.mergeLookup(rows, out)
		if err != nil || !done {
			return err
		}
		rows, out = he.hold.rows, he.hold.acc
	}
	return s.off.rt.AccumulateGradRows(ctx, v.Name, rows, out)
}

// wantsRows: a streamed lookup's gradient is handed over by rows.
func (s *zinfSource) wantsRows(v *Var) bool { return s.byRows(v) }

// gradRowSums hands over the sums of the rows the batch uses
// (loop.lookupGrad).
func (s *zinfSource) gradRowSums(ctx context.Context, v *Var, rows []int, sums []float32) error {
	if he := s.ex.head; he.holds(v) {
		// A layer-major step's head gradient of the lookup's rows is
		// added in micro-batch order and handed over after the last
		// micro-batch (headHold).
		done, err := he.mergeLookup(rows, sums)
		if err != nil || !done {
			return err
		}
		rows, sums = he.hold.rows, he.hold.acc
	}
	t0 := time.Now()
	err := s.off.rt.AccumulateGradRows(ctx, v.Name, rows, sums)
	s.times.Grads += time.Since(t0)
	if err != nil {
		return fmt.Errorf("zgomlx: gradient of %q: %w", v.Name, err)
	}
	return nil
}

// readAheadTables starts or extends the read-ahead of Options.ReadAheadTables
// during the backward pass of a step's last micro-step (last): at its
// start and at each layer, each call reading ahead what the optimizer's
// pipeline has room for since the one before.
func readAheadTables(ctx context.Context, src paramSource, last bool) {
	s, ok := src.(*zinfSource)
	if !ok || !last || !s.off.readAhead || len(s.ex.layers) == 0 {
		return
	}
	le := s.ex.layers[0]
	for _, v := range le.vars[:le.own] {
		if v.lookup < 0 {
			continue
		}
		// A failure here is the step's, which the table's hand-over
		// reports; nothing read ahead is only slower.
		_, _ = s.off.rt.PrefetchTensor(ctx, v.Name)
	}
}

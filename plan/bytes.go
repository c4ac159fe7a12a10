package plan

import (
	"fmt"
	"io"

	"github.com/zinfio/zinf/config"
	"github.com/zinfio/zinf/policy"
	"github.com/zinfio/zinf/swapper/optimizer"
)

// StepBytes are the NVMe bytes one training step moves per parameter
// element, by kind: the parameters read for the forward and backward
// passes and written back after the update, the gradients written behind
// and read back, and the optimizer's records (master and states) read and
// written. They count the tensors as the runtime moves them: parameters
// in their dtype, gradients and masters in fp32, the states in their
// format (zinf.optimizer_states; tensors kept in fp32 by
// zinf.optimizer_states_fp32 or their size count as fp32 ones), and
// nothing for a tier in memory.
// Padding, checksums and a CPU cache in front of NVMe
// (offload_param.max_in_cpu) are not counted.
type StepBytes struct {
	ParamRead, ParamWrite float64
	GradWrite, GradRead   float64
	StateRead, StateWrite float64
}

// KeepGrads is b with a fraction kept (0 to 1) of the gradient elements
// kept in pinned memory for the whole step (zinf.pinned_grads,
// Reservations.GradKept): those are neither written to NVMe nor read
// back, whatever the schedule.
func (b StepBytes) KeepGrads(kept float64) StepBytes {
	kept = min(max(kept, 0), 1)
	b.GradWrite *= 1 - kept
	b.GradRead *= 1 - kept
	return b
}

// GradKeptFraction is the fraction of the gradient elements that r keeps
// in pinned memory (StepBytes.KeepGrads); 0 when none go to a store.
func (r Reservations) GradKeptFraction() float64 {
	if r.GradElems == 0 {
		return 0
	}
	return float64(r.GradKeptElems) / float64(r.GradElems)
}

// Total is the sum of every kind.
func (b StepBytes) Total() float64 {
	return b.ParamRead + b.ParamWrite + b.GradWrite + b.GradRead + b.StateRead + b.StateWrite
}

// StepBytesPerParam returns the bytes per parameter per step of cfg with
// the optimizer states in format f, for micro micro-batches a step
// (>= 1) in schedule (policy.ScheduleLayerMajor reads each layer's
// parameters once per pass and writes its summed gradient once;
// micro-batch-major reads them in every micro-batch's passes and writes
// and reads back the gradient partition every micro-batch, as
// ZeRO-Infinity does). The record of an element is its fp32 master and
// the rule's states: optimizer.StateFormat.RecordBytes.
func StepBytesPerParam(cfg *config.Config, f optimizer.StateFormat, micro int, schedule string) StepBytes {
	micro = max(micro, 1)
	passes := 1.0 // of each layer's parameters per forward (and per backward)
	gradTrips := 1.0
	if schedule == policy.ScheduleMicroBatchMajor {
		passes, gradTrips = float64(micro), float64(micro)
	}
	var b StepBytes
	zo := cfg.ZeroOptimization
	if zo.OffloadParam.Device == config.OffloadNVMe {
		p := float64(ParamDType(cfg).Size())
		b.ParamRead = 2 * passes * p
		b.ParamWrite = p
	}
	if zo.OffloadOptimizer.Device == config.OffloadNVMe {
		b.GradWrite, b.GradRead = 4*gradTrips, 4*gradTrips
		// A large record's per-element bytes: StateBytes' absmax share
		// is exact in the limit.
		const n = 1 << 30
		rec := float64(f.RecordBytes(Hyper(cfg), n)) / n
		b.StateRead, b.StateWrite = rec, rec
	}
	return b
}

// WriteStepBytes prints, as `zinf plan` does, the NVMe bytes per
// parameter per step of cfg's configuration as pl places it, and of the
// same configuration with fp32 optimizer states when cfg's are narrower,
// every gradient taking the NVMe round trip (WritePlanStepBytes counts
// the gradients a plan keeps in pinned memory).
func WriteStepBytes(w io.Writer, cfg *config.Config, pl *policy.Placement) {
	writeStepBytes(w, cfg, pl, 0)
}

// WritePlanStepBytes is WriteStepBytes for p, whose reservations may keep
// gradients in pinned memory (zinf.pinned_grads): its first line counts
// them as kept; when some are, the last line is today's configuration
// without them (fp32 states, every gradient to NVMe and back).
func WritePlanStepBytes(w io.Writer, cfg *config.Config, p *Plan) {
	if p == nil {
		writeStepBytes(w, cfg, nil, 0)
		return
	}
	writeStepBytes(w, cfg, p.Placement, p.Reservations.GradKeptFraction())
}

func writeStepBytes(w io.Writer, cfg *config.Config, pl *policy.Placement, kept float64) {
	micro, schedule := 1, policy.ScheduleLayerMajor
	if pl != nil {
		micro, schedule = max(pl.MicroBatches, 1), pl.Schedule
	}
	f := StateFormatOf(cfg)
	line := func(label string, b StepBytes) {
		fmt.Fprintf(w, "  %-28s %6.2f (params read %.2f, written %.2f; gradients written %.2f, read %.2f; optimizer records read %.2f, written %.2f)\n",
			label, b.Total(), b.ParamRead, b.ParamWrite, b.GradWrite, b.GradRead, b.StateRead, b.StateWrite)
	}
	fmt.Fprintf(w, "\nnvme bytes per parameter per step (%s, k=%d; padding and checksums aside):\n", schedule, micro)
	label := fmt.Sprintf("optimizer states %s:", f)
	if kept > 0 {
		label = fmt.Sprintf("states %s, grads pinned:", f)
		if kept < 1 {
			label = fmt.Sprintf("states %s, %.0f%% grads pinned:", f, 100*kept)
		}
	}
	line(label, StepBytesPerParam(cfg, f, micro, schedule).KeepGrads(kept))
	if f != optimizer.FormatFP32 || kept > 0 {
		line("optimizer states fp32:", StepBytesPerParam(cfg, optimizer.FormatFP32, micro, schedule))
	}
}

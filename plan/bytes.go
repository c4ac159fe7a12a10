package plan

import (
	"fmt"
	"io"

	"github.com/zinfio/zinf/config"
	"github.com/zinfio/zinf/policy"
	"github.com/zinfio/zinf/swapper/optimizer"
)

// StateFormatOf is the optimizer's state format zinf.optimizer_states
// names (fp32 for an empty or unknown word, which Validate refuses).
func StateFormatOf(cfg *config.Config) optimizer.StateFormat {
	f, err := optimizer.ParseStateFormat(string(cfg.Zinf.OptimizerStates))
	if err != nil {
		return optimizer.FormatFP32
	}
	return f
}

// StateFormatForOf is the optimizer's per-tensor rule for cfg's
// compressed states (nil for fp32): optimizer.KeepFP32 with
// zinf.optimizer_states_fp32's patterns, tensors under
// optimizer.MinCompressedElems elements in fp32 too.
func StateFormatForOf(cfg *config.Config) func(name string, elems int) optimizer.StateFormat {
	f := StateFormatOf(cfg)
	if f == optimizer.FormatFP32 {
		return nil
	}
	return optimizer.KeepFP32(f, optimizer.MinCompressedElems, cfg.Zinf.OptimizerStatesFP32)
}

// SubGroupSizeOf is the optimizer's sub-group size for cfg:
// zero_optimization.sub_group_size capped at 2^30 elements and, with 8-bit
// states, rounded down to a multiple of their block
// (optimizer.Blockwise8BlockSize; at least one block), so that sub-groups
// start blocks, as optimizer.Options.Validate requires.
func SubGroupSizeOf(cfg *config.Config) int {
	n := int(min(cfg.ZeroOptimization.SubGroupSize, 1<<30))
	if StateFormatOf(cfg).Encoding == optimizer.EncodingBlockwise8 {
		n = max(n/optimizer.Blockwise8BlockSize, 1) * optimizer.Blockwise8BlockSize
	}
	return n
}

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
// same configuration with fp32 optimizer states when cfg's are narrower.
func WriteStepBytes(w io.Writer, cfg *config.Config, pl *policy.Placement) {
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
	line(fmt.Sprintf("optimizer states %s:", f), StepBytesPerParam(cfg, f, micro, schedule))
	if f != optimizer.FormatFP32 {
		line("optimizer states fp32:", StepBytesPerParam(cfg, optimizer.FormatFP32, micro, schedule))
	}
}

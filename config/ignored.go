package config

import (
	"fmt"
	"math"
)

// ignoredType is the JSON type DeepSpeed requires of a key zinf accepts
// without acting on. zinf checks it, as DeepSpeed would refuse the file
// otherwise: a config zinf accepts is one DeepSpeed accepts too.
type ignoredType int

const (
	anyType ignoredType = iota
	boolType
	intType    // a whole number, or "auto" (Hugging Face fills it in)
	numberType // any number, or "auto"
	stringType
	objectType
)

func (t ignoredType) String() string {
	return [...]string{"any value", "a boolean (true or false)", `an integer (or "auto")`, `a number (or "auto")`, "a string", "an object"}[t]
}

// maxIgnoredString bounds a string anywhere in an ignored key's value:
// DeepSpeed's strings there are names, paths and dtypes, and the value is
// kept (Config.Ignored names it) and may be printed.
const maxIgnoredString = 4096

// ignoredTypes gives the type of each DeepSpeed key zinf ignores, from
// DeepSpeed's config reference (deepspeed/runtime/config.py, zero/config.py
// and the monitor, profiling, compression and autotuning sections). A name
// missing here is accepted with any type.
var ignoredTypes = map[string]ignoredType{
	// Top level.
	"train_batch_size": intType, "train_batch_size_per_gpu": intType, "steps_per_print": intType,
	"wall_clock_breakdown": boolType, "memory_breakdown": boolType, "dump_state": boolType,
	"prescale_gradients": boolType, "gradient_predivide_factor": numberType,
	"sparse_gradients": boolType, "fp32_allreduce": boolType,
	"communication_data_type": stringType, "seq_parallel_comm_data_type": stringType,
	"disable_allgather": boolType, "zero_allow_untested_optimizer": boolType, "zero_force_ds_cpu_optimizer": boolType,
	"dataloader_drop_last": boolType, "graph_harvesting": boolType, "use_data_before_expert_parallelism": boolType,
	"vocabulary_size": intType, "sequence_parallel_size": intType, "gradient_accumulation_dtype": stringType,
	"mp_size": intType,
	"amp":     objectType, "tensorboard": objectType, "wandb": objectType, "csv_monitor": objectType, "comet": objectType,
	"comms_logger": objectType, "flops_profiler": objectType,
	// activation_checkpointing (its cpu_checkpointing is read).
	"partition_activations": boolType, "contiguous_memory_optimization": boolType, "number_checkpoints": intType,
	"synchronize_checkpoint_boundary": boolType, "profile": boolType,
	"sparse_attention": objectType, "eigenvalue": objectType, "progressive_layer_drop": objectType,
	"curriculum_learning": objectType, "data_efficiency": objectType, "compression_training": objectType,
	"checkpoint": objectType, "data_types": objectType, "elasticity": objectType, "autotuning": objectType,
	"pipeline": objectType, "nebula": objectType, "hybrid_engine": objectType, "compile": objectType,
	"timers": objectType, "torch_autocast": objectType, "tensor_parallel": objectType,
	"weight_quantization": objectType, "quantize_training": objectType, "zenflow": objectType,
	// zero_optimization.
	"contiguous_gradients": boolType, "overlap_comm": boolType, "reduce_scatter": boolType,
	"reduce_bucket_size": intType, "allgather_partitions": boolType, "allgather_bucket_size": intType,
	"use_multi_rank_bucket_allreduce": boolType, "load_from_fp32_weights": boolType, "elastic_checkpoint": boolType,
	"round_robin_gradients": boolType, "ignore_unused_parameters": boolType, "legacy_stage1": boolType,
	"stage3_prefetch_bucket_size": intType, "prefetch_bucket_size": intType,
	"stage3_param_persistence_threshold": intType, "param_persistence_threshold": intType,
	"stage3_model_persistence_threshold": intType, "model_persistence_threshold": intType,
	"stage3_max_live_parameters": intType, "max_live_parameters": intType,
	"stage3_max_reuse_distance": intType, "max_reuse_distance": intType,
	"stage3_gather_16bit_weights_on_model_save": boolType, "gather_16bit_weights_on_model_save": boolType,
	"stage3_gather_fp16_weights_on_model_save": boolType,
	"stage3_module_granularity_threshold":      intType, "module_granularity_threshold": intType,
	"stage3_use_all_reduce_for_fetch_params": boolType, "use_all_reduce_for_fetch_params": boolType,
	"zero_hpz_partition_size": intType, "zero_quantized_weights": boolType,
	"zero_quantized_nontrainable_weights": boolType, "zero_quantized_gradients": boolType,
	"zeropp_loco_param": objectType, "mics_shard_size": intType, "mics_hierarchical_params_gather": boolType,
	"memory_efficient_linear": boolType, "pipeline_loading_checkpoint": boolType,
	"override_module_apply": boolType, "log_trace_cache_warnings": boolType,
	// fp16, bf16.
	"auto_cast": boolType, "fused_mode": boolType, "fp16_master_weights_and_grads": boolType,
	"immediate_grad_update": boolType, "check_grad_overflow": boolType,
	"bf16_master_weights_and_grads": boolType, "bf16_optimizer_states": boolType,
	// optimizer.
	"legacy_fusion": boolType, "torch_adam": boolType, "fused": boolType, "foreach": boolType,
	"differentiable": boolType,
}

// checkIgnored checks the value of an ignored DeepSpeed key: its type (as
// DeepSpeed requires it; null is always accepted, as DeepSpeed's optional
// fields accept it) and that no string in it is longer than
// maxIgnoredString.
func (d *decoder) checkIgnored(n *node, key, name string) {
	if n.kind == kNull {
		return
	}
	t := ignoredTypes[name]
	auto := n.kind == kString && n.str == "auto"
	ok := true
	switch t {
	case boolType:
		ok = n.kind == kBool
	case intType:
		if auto {
			return
		}
		if n.kind == kNumber {
			d.integral(n, key, math.MinInt64, math.MaxInt64)
			return
		}
		ok = false
	case numberType:
		if auto {
			return
		}
		ok = n.kind == kNumber
	case stringType:
		ok = n.kind == kString
	case objectType:
		ok = n.kind == kObject
	}
	if !ok {
		d.valueProblem(n, key, fmt.Sprintf("is %s, not %s (DeepSpeed's type for this key, which zinf does not use)", n.kind, t), "")
		return
	}
	d.boundStrings(n, key)
}

// boundStrings refuses a string longer than maxIgnoredString anywhere in
// n, naming its path.
func (d *decoder) boundStrings(n *node, key string) {
	switch n.kind {
	case kString:
		if len(n.str) > maxIgnoredString {
			d.problemAt(n.off, Problem{Key: key, Value: n.raw,
				Msg:     fmt.Sprintf("is a string of %d bytes, longer than a DeepSpeed key zinf ignores takes", len(n.str)),
				Allowed: fmt.Sprintf("at most %d bytes", maxIgnoredString)})
		}
	case kObject:
		for _, m := range n.members {
			d.boundStrings(m.val, key+"."+m.key)
		}
	case kArray:
		for i, e := range n.elems {
			d.boundStrings(e, fmt.Sprintf("%s[%d]", key, i))
		}
	}
}

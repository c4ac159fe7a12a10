package zinf

// The config in each component's words moved to package plan, beside the
// planner that reads it; these forward to it.

import "github.com/zinfio/zinf/plan"

// The translators from a config to one component's options, for tools
// that build a component alone, are package plan's; these names forward
// to them.
var (
	// ParamDType is the parameter dtype a config asks for.
	//
	// Deprecated: use plan.ParamDType.
	ParamDType = plan.ParamDType
	// EngineOptions maps the config's aio section and zinf's I/O keys to
	// engine options.
	//
	// Deprecated: use plan.EngineOptions.
	EngineOptions = plan.EngineOptions
	// Hyper maps the config's optimizer section to the optimizer's rule
	// and hyperparameters.
	//
	// Deprecated: use plan.Hyper.
	Hyper = plan.Hyper
	// GDSMode returns the GPUDirect Storage mode the config selects.
	//
	// Deprecated: use plan.GDSMode.
	GDSMode = plan.GDSMode
	// GDSOptions maps the config's aio section to the cuFile engine's
	// options.
	//
	// Deprecated: use plan.GDSOptions.
	GDSOptions = plan.GDSOptions
	// BounceOptions maps the config's aio section to the bounce path's
	// options.
	//
	// Deprecated: use plan.BounceOptions.
	BounceOptions = plan.BounceOptions
	// HintsFor maps a config's DeepSpeed offload keys to the policy's
	// hints.
	//
	// Deprecated: use plan.HintsFor.
	HintsFor = plan.HintsFor
)

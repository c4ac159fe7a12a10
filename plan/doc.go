// Package plan is zinf's planner: a pure function from what a run is
// given and what the machine measured to what it builds.
//
// Check validates a config, a Model and the rank and world size, and reads
// the config in each component's words (Settings: the engine's, the swap
// stores', the device's, the optimizer's, the schedule's options). Make
// takes those checked Inputs, what the machine measured beside them
// (Measured: the NVMe bandwidth, and the swap stores' geometry, a value
// GeometryOf computes from the settings) and the caller's choices
// (Options), and returns a Plan: where each tensor lives and the predicted
// step (policy.Placement), how the pinned pool is split (Reservations),
// the free disk each NVMe path needs, and every component's options
// (Components). It reads no file, opens nothing and refers to no runtime:
// zinf.Open measures, calls Make and builds each component from the plan
// alone, opening the swap stores only then; zinf.PlanModel returns the
// plan without building.
//
// The translators from a config to one package's options (EngineOptions,
// GDSOptions, BounceOptions, Hyper, ParamDType, GDSMode, HintsFor,
// StoreOptions) are here too, for tools that build one component alone.
package plan

// Package zinf trains and serves models larger than the memory that holds
// them. Parameters, optimizer states and gradients live on GPU, CPU (pinned
// host memory) or NVMe, as a config file says, and move between tiers with
// overlapped asynchronous swaps.
//
// Open builds a Runtime from a config (DeepSpeed's ds_config.json keys are
// understood as they are): the pinned buffer pool, the async I/O engine,
// the swap stores on the NVMe paths, the device (a simulated GPU when none
// is present), and the param, gradient and optimizer swappers. A training
// loop registers its parameters, asks for each layer's parameters before
// using them (a barrier that also prefetches what comes next), hands over
// gradients as backward produces them, and calls Step. Close drains I/O,
// frees pinned memory and removes the scratch swap files.
//
// SaveCheckpoint, SaveCheckpointAsync and LoadCheckpoint save and restore
// every rank's parameters and optimizer states (package checkpoint:
// safetensors files, a crash-safe commit, loads at any world size). A
// Checkpointer saves a loop's checkpoints every N steps into one root,
// keeping the newest few; after a crash, ResumeLatest loads the newest
// committed one.
//
// The packages underneath can be used alone: aio (the I/O engine), buffers
// (the pinned pool), swapper and its param/optimizer/grad subpackages,
// policy (placement and prefetch scheduling), config, accel and gds.
package zinf

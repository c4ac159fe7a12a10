// Package policy decides where zinf keeps each tensor and when it moves:
// the placement of parameters, gradients and optimizer states on the GPU,
// in pinned host memory (CPU) or on NVMe, the pinned swap buffers, the
// prefetch depth, and a predicted step time; and a Scheduler that walks a
// pass's layers, prefetching ahead of use within a byte budget.
//
// It depends on no other zinf package but tensor (for Tier and DType), so
// its decisions are plain functions of their inputs, tested with golden
// files.
//
// # Use
//
//	spec, err := policy.ParseModelSpec("layers=24,width=4096,dtype=bf16")
//	inv := spec.Inventory(rank, world)
//	p, err := policy.Plan(tiers, inv, hints) // *CapacityError when it does not fit
//	p.WriteTable(os.Stdout)                  // what `zinf plan` prints
//
//	s := policy.NewScheduler(p, p.NVMeParamsByLayer(), paramSwapper, policy.SchedulerOptions{})
//	s.StartPass(forward) // 0..L-1
//	for _, l := range forward {
//		if err := s.Begin(ctx, l); err != nil { ... }
//		compute(l)
//		s.End(l)
//	}
//
// # Placement rules
//
// Hints carry DeepSpeed's semantics: offload_param and offload_optimizer
// devices ("none", "cpu", "nvme"), max_in_cpu, buffer counts and sizes,
// and the optimizer offload ratio. Plan honours them or returns an error
// that says how many bytes are needed against how many there are: it never
// moves a tensor off the GPU that the hints keep there. What the hints
// leave to the policy (buffer counts, prefetch depth, the parameter cache)
// it sizes to the pinned budget, and says in Placement.Notes whenever it
// had to use less than asked. See Plan for the rules in order.
//
// # Caveats
//
// The prediction is a model, not a measurement: reads and writes are two
// FIFO streams at the configured bandwidths (a layer's NVMe read and its
// copy to the device are one fetch), compute is split 1:2 between forward
// and backward, the optimizer's arithmetic is not counted, and parameters
// all-gathered across ranks are not counted in the GPU working set. Use it
// to compare placements, not to promise a time.
package policy

package zinf

import (
	"log/slog"

	"github.com/zinfio/zinf/config"
)

// gradKeep is the gradient swapper's Options.Keep: the gradients the plan
// keeps in pinned memory for the whole run (zinf.pinned_grads,
// plan.Reservations.GradKept). The optimizer's update reads them where
// the backward pass summed them, so they are never written to NVMe nor
// read back; nil when none are kept.
func (r *Runtime) gradKeep() func(string) bool {
	if len(r.res.GradKept) == 0 {
		return nil
	}
	keep := make(map[string]bool, len(r.res.GradKept))
	for _, n := range r.res.GradKept {
		keep[n] = true
	}
	return func(name string) bool { return keep[name] }
}

// logPinnedGrads says at Open which gradients stay in pinned memory and,
// when some take the NVMe round trip, why and what pool would keep them.
func (r *Runtime) logPinnedGrads(log *slog.Logger) {
	res := r.res
	if r.inference || r.GradStore == nil || res.GradElems == 0 {
		return
	}
	switch {
	case res.GradKeptElems == res.GradElems:
		log.Info("zinf: every gradient stays in pinned memory (zinf.pinned_grads): the update reads it there, with no NVMe write-behind nor read-back",
			"tensors", len(res.GradKept), "bytes", config.Size(res.GradKeptBytes).String())
	default:
		log.Info("zinf: "+res.GradKeptNote, "kept_tensors", len(res.GradKept))
	}
}

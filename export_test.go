package zinf

import (
	"github.com/zinfio/zinf/buffers"
	"github.com/zinfio/zinf/swapper/grad"
)

// ForgetBandwidths empties the process's memory of NVMe bandwidths, so a
// test sees a probe or a cache file rather than an earlier test's figure.
var ForgetBandwidths = forgetBandwidths

// PoolOf is a runtime's pinned pool, for the tests that hold its memory
// or print its holders.
func PoolOf(r *Runtime) *buffers.Pool { return r.pool }

// GradsOf is a runtime's gradient swapper, for the tests that read a
// gradient back.
func GradsOf(r *Runtime) *grad.Swapper { return r.grads }

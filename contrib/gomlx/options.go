package zgomlx

import (
	"fmt"

	"github.com/gomlx/gomlx/ml/model"

	"github.com/zinfio/zinf"
)

// Options configure Create and Register.
type Options struct {
	// Filter selects the variables zinf holds and trains. Default
	// (nil): DefaultFilter, every trainable variable of a float dtype
	// (float32, bfloat16, float16). Variables left out stay in the Store
	// with their values; the per-layer executors read them and nothing
	// trains them.
	Filter func(v *model.Variable) bool
	// Layers are the layers' scope paths in forward order ("/block_0",
	// ...): a variable belongs to the first layer whose scope holds it.
	// Default: the first-level scopes of the selected variables, in the
	// order their first variable was created. A Trainer takes them from
	// its Net.
	Layers []string
	// KeepValues leaves the registered variables' values in the Store.
	// Default false: once zinf has a variable, its value is released (the
	// Store keeps its shape), so the parameters live only in zinf.
	KeepValues bool
	// HeapCredit makes the Go garbage collector, which paces itself by
	// the live heap, collect about as often as when the model's state is
	// on the heap (in-memory training) instead of 1.8-4x as often:
	// while the Offload is open, GOGC is scaled so that the next cycle
	// comes after the growth it would with HeapCredit more bytes live
	// (see internal/gccredit; Trainer re-evaluates it at every commit, Close
	// restores GOGC). Like a higher GOGC, it trades memory for cycles.
	// 0 (default) or AutoHeapCredit: what in-memory training keeps live
	// (InMemoryBytes), at most a quarter of the machine's memory; measured
	// (examples/gcm), GC cycles per step 0.9x of in-memory training on an
	// MLP and on the zoo transformer (4.2x and 1.8x without), for 23 and
	// 14 MB more peak RSS. NoHeapCredit: none. Nothing is
	// changed while a Go memory limit is set (GOMEMLIMIT,
	// debug.SetMemoryLimit: the limit paces the collector then) or with
	// GOGC=off. Offload.HeapCredit reports what was taken.
	HeapCredit int64
	// OneLayerResident makes a Trainer hold one layer's weights and one
	// layer's gradients in Go memory at a time instead of two of each: a
	// layer is swapped in after the layer before it has computed (not
	// while it computes), and a layer's gradients are handed over before
	// the next layer's backward runs (not during it). For a model whose
	// layers are large against the machine's memory (bench-llm-big's
	// blocks are 201 MiB of fp32 weights each), it takes one layer's
	// weights and one layer's gradients off the peak resident set, and
	// costs the time of those swap-ins and hand-overs, which no longer hide
	// behind compute (the Timings' SwapIn and Grads). Results are the same
	// bits either way. Default false: overlap.
	OneLayerResident bool
	// ReadAheadTables makes a Trainer read the optimizer states (fp32
	// master and Adam's moments) of the first layer's lookup tables
	// (Layer.Lookups, the embedding) from NVMe ahead of their gradient:
	// from the start of a step's last backward pass,
	// zinf.Runtime.PrefetchTensor starts those reads, so that once the
	// table's gradient is final (it is last) only the update's arithmetic
	// and its write-back remain. The reads go into the optimizer's pinned
	// buffers that its pipeline can spare (it keeps one set for the
	// updates of the layers handed over) and never wait, so how much is
	// read ahead is bounded by the pool's optimizer share, not by the
	// table; results are bit for bit the same either way. It acts when
	// the runtime starts updates during the backward pass (the plan's
	// OverlapStep) and the states are on NVMe; it may be combined with
	// zinf.overlap_update, which lets the table's update run on under the
	// next forward pass instead. Default false.
	ReadAheadTables bool
	// Runtime is passed to zinf.Open.
	Runtime zinf.Options

	// also are further scopes of each layer (Layer.Also), from the Net.
	also [][]string
}

// AutoHeapCredit, as Options.HeapCredit, sizes the heap credit from the
// model: the bytes training in memory would keep live on the Go heap
// (Offload.InMemoryBytes: the parameters, and the optimizer's fp32
// master weights and states), at most a quarter of the machine's memory.
//
// It is the default: Options.HeapCredit 0 means AutoHeapCredit.
const AutoHeapCredit int64 = -1

// NoHeapCredit, as Options.HeapCredit, takes no credit: the collector
// paces by the small live heap of offloaded training (more cycles, less
// memory).
const NoHeapCredit int64 = -2

// checkHeapCredit says whether n is an Options.HeapCredit allowed.
func checkHeapCredit(n int64) error {
	if n < 0 && n != AutoHeapCredit && n != NoHeapCredit {
		return fmt.Errorf("zgomlx: Options.HeapCredit %d: want 0 or AutoHeapCredit (%d: the default, what training in memory keeps live), NoHeapCredit (%d), or a number of bytes", n, AutoHeapCredit, NoHeapCredit)
	}
	return nil
}

// Package reference holds the in-memory references offloaded GoMLX
// training is checked and timed against: what zgomlx.Trainer must equal,
// bit for bit, with every variable and optimizer state in Go memory.
//
//   - MemoryTrainer runs zgomlx's own per-layer executors, in the
//     Trainer's order, with zinf's Adam on fp32 master weights in Go
//     memory: the offloaded Trainer equals it bit for bit.
//   - WholeGraph trains a Net (NewWholeGraph) or a plain GoMLX model
//     function (NewWholeGraphModel) the usual GoMLX way, the model and
//     its optimizer update in one graph; WholeGraphGradients gives one
//     batch's gradients so. With Adam (zinf's Adam as a GoMLX optimizer)
//     it matches the Trainer too; with GoMLX's own Adam it shows how far
//     that one rounds from zinf's.
//
// A test compares a Trainer with a MemoryTrainer built over a copy of the
// same Store:
//
//	mt, _ := reference.NewMemoryTrainer(backend, store, net, cfg, zgomlx.Options{})
//	defer mt.Close()
//	want, _ := mt.Step(ctx, x, labels) // the Store's values are updated in place
//
// Nothing here offloads: a model that does not fit in memory does not fit
// here either.
package reference

// Package zgomlx trains GoMLX models with zinf as their memory: the
// variables of a model.Store live in zinf (parameters, fp32 master
// weights and Adam states on NVMe or in pinned memory, as the config
// plans), and a chain of layers runs through per-layer executors that
// swap each layer's variables in just before it runs.
//
// # Use
//
//	backend, _ := compute.NewWithConfig(zgomlx.DefaultBackend) // the pure-Go backend
//	net := zgomlx.Net{Loss: loss}
//	for i := range blocks {
//		net.Layers = append(net.Layers, zgomlx.Layer{Scope: fmt.Sprintf("/block_%d", i), Fn: block})
//	}
//	tr, _ := zgomlx.Create(ctx, backend, cfg, model.NewStore(), net, zgomlx.Options{}, xShape)
//	defer tr.Close()
//	for step := range steps {
//		loss, err := tr.Step(ctx, x, labels)
//	}
//
// Given the first layer's input shapes, Create makes the variables and
// initializes them one layer at a time straight into zinf, with the
// values GoMLX's Initialize would give them in memory; given none, it
// registers a Store whose variables already have values (Initialize, a
// GoMLX checkpoint). Register is the layer below: the variables in zinf
// (an Offload: checkpoints, ReadVariable, Restore) without executors.
//
// A layer may take and return several tensors (Layer.FnN: float ones
// get gradients, int ones such as token ids pass along), keep its
// variables under several scopes (Layer.Also) and read an earlier
// layer's variable (Layer.Borrow: tied embeddings, one zinf tensor whose
// gradient sums both uses). The first layer's Layer.Lookups names a
// variable its graph only Gathers at an integer input (an embedding
// table): one that zinf streams is read, and its gradient handed over,
// at the batch's rows only (TransformerNet sets it on the token table).
// Net.TrainLoss takes GoMLX's train.LossFn.
//
// # GoMLX's zoo transformer
//
// TransformerNet runs ml/zoo/transformer's Model through its exported
// pieces, one zinf layer each (EmbedTokens, ForwardLayer per block,
// LogitsFromEmbeddings), and TransformerLoss is its next-token loss:
//
//	store := model.NewStore()
//	m := transformer.New(store.RootScope()).WithVocabSize(v).WithEmbedDim(d).WithNumLayers(n)...
//	net, _ := zgomlx.TransformerNet(m, zgomlx.TransformerOptions{})
//	tr, _ := zgomlx.Create(ctx, backend, cfg, store, net, zgomlx.Options{}, shapes.Make(dtypes.Int32, batch, seq))
//
// It trains bit for bit as m.Logits in one graph
// (reference.NewWholeGraphModel) with the same optimizer.
//
// # How it works
//
// A compiled graph needs every variable it reads, so a model larger than
// memory runs layer by layer: layer l's forward executor computes
// y = Fn(x); its backward executor recomputes y and takes the
// vector-Jacobian product with autodiff, the gradients of sum(y*dy) for x
// and the layer's variables, which equal the whole graph's gradients bit
// for bit. The variables are fed to the executors from swap-in buffers:
// GoMLX tensors over the backend's shared buffers, one set per shape,
// reused from layer to layer, into which zinf copies a layer's values
// (converting the dtype when the Store's differs from zinf's param dtype)
// right after swapping it in. Gradients go to zinf as each layer's
// backward produces them, and each layer's Adam update starts at once,
// overlapping the rest of the backward pass. A layer whose values are
// still in their buffers (the last layer at the turn of the pass) is not
// read again. The executors run on a worker goroutine; the loop's
// goroutine, the only one that calls zinf, swaps the next layer in and
// hands the previous layer's gradients over while a layer computes.
//
// # Micro-batches
//
// Trainer.StepMicroBatches trains a step of k micro-batches in the plan's
// order (zinf.schedule). Layer-major, every micro-batch runs through a
// layer while its weights are in the buffers, so each layer is read once
// per pass whatever k, its gradients are summed over the k in pinned
// memory, and the inputs of every layer but the first go to zinf's
// activation tier (memory, pinned memory or NVMe) until the backward
// pass; micro-batch-major is Accumulate, ..., Step. Both give the same
// bits. Loop takes gradient_accumulation_steps batches per step.
//
// # Errors
//
// A step is all or nothing. A failure before its commit (a swap-in, a
// full disk under a gradient) returns an error wrapping ErrStepAborted:
// the step is given up and the model is as the last commit left it, so
// the step runs again from its first micro-step. A failed commit returns
// ErrCommitPending: nothing changed, the gradients are kept, and Commit
// runs it again. Either way the retry gives the fault-free result.
//
// # Garbage collection
//
// The Go collector paces itself by the live heap. Offloaded, the model's
// state is not on the Go heap, so the same GoMLX temporaries bring
// 1.8-4x the collections of in-memory training. By default
// (Options.HeapCredit 0, AutoHeapCredit: what in-memory training keeps
// live) GOGC is scaled while the model is open so that the collector
// paces as if that state were live: as many collections as in memory
// (0.9x measured on an MLP and on the zoo transformer), and a heap that
// grows as far between them (14-23 MB more peak RSS there).
// NoHeapCredit opts out.
//
// Package reference holds what offloaded training is checked against:
// its MemoryTrainer runs the same executors with everything in Go memory
// and zinf's Adam, and offloaded training equals it bit for bit;
// reference.Adam is zinf's Adam (torch.optim.Adam's formula) as a GoMLX
// optimizer, so a whole-graph GoMLX training loop (reference.WholeGraph)
// matches too; GoMLX's own Adam rounds differently.
//
// # Caveats
//
// Built and tested with github.com/gomlx/gomlx v0.28.2 and
// github.com/gomlx/compute v0.1.2 (pinned in go.mod; the module proxy's
// @latest resolves to an older GoMLX).
// Only the pure-Go backend (compute.NewWithConfig("go"), built with
// CGO_ENABLED=0) is supported: executors read and write its shared
// buffers. Use DefaultBackend ("go:ops_sequential"): compute v0.1.2 can
// deadlock running several large matrix products at once on few cores.
// Its fused dense op has no bf16/fp16 kernel, so half-precision models set
// GOMLX_FUSION=false (graph.FusionEnv) to use the decomposed ops. Layers
// must be pure functions of their inputs and variables: Create with input
// shapes refuses, naming it, a layer that updates a variable in its graph
// (dropout, batch statistics) or adds a regularization loss (the per-layer
// backward would drop it); without them the first Step finds it and fails
// with ErrNotPure
// (not the retryable ErrStepAborted). Every variable belongs to
// one layer (later layers may borrow it), and the loss has no variables.
// The layers' outputs are kept for the backward pass (activations are
// not offloaded).
package zgomlx

// Package decoder is zinf's native decoder: the forward pass of a
// decoder-only transformer computed straight from the bytes its weights
// are stored in (zinf's pinned buffers, a mapped file), with fp32
// activations, a KV cache in memory the caller provides and every
// matrix product on decoder/kernels (out-in weights on its row products,
// the zoo's in-out weights on its in-out products). It depends on
// nothing outside zinf's core module.
//
// # Models
//
// Config describes the architecture GoMLX's zoo transformer and the Llama,
// Qwen and Gemma families share: token embeddings (optionally scaled by
// sqrt(Dim) and normalized), Layers blocks of grouped-query attention with
// RoPE and a feed-forward network, a final normalization and an output
// head (its own matrix, or the embedding table when tied). Block picks the
// order of normalizations and residuals: PostNorm is the zoo's standard
// architecture, PreNorm Llama's and Qwen's, Sandwich Gemma 2's and 3's and
// the zoo's Gemma. Norms are RMSNorm (with Gemma's scale offset) or
// LayerNorm; the FFN is plain (act(up x)) or gated (act(gate x) * up x),
// the zoo's swiglu storing gate and up as one matrix (FusedGateUp). RoPE
// rotates the first RoPEDims dimensions of each head, pairing dimension i
// with i + RoPEDims/2 as the zoo and Hugging Face's Llama do (or 2i with
// 2i+1, RoPEInterleaved), at inverse frequencies base^(-2i/RoPEDims)
// computed in float32 as the zoo computes them. Query head h reads
// key/value head h / (Heads/KVHeads). Validate names each bad field, its
// value and what is allowed.
//
// Config.Names lists the weights a configuration needs, by Role, under
// the zoo's variable paths (as zinf's generator names its tensors) or
// Hugging Face's tensor names.
//
// # A pass
//
// A forward pass runs over a batch of sequences, the same number of new
// tokens for each: one for a decoding step, the prompt for a prefill.
//
//	d, _ := decoder.New(cfg, pool)
//	cache, _ := decoder.NewKVCache(cfg, batch, maxLen, k, v)
//	d.Begin(cache, tokens, positions, &model) // the embeddings
//	for l := range cfg.Layers {
//		d.Layer(l, &layers[l]) // layer l's weights, read during the call only
//	}
//	d.Logits(&model, logits) // the last new position of each sequence
//
// The new positions' queries, keys and values are matrix products over
// all the new tokens of the batch (MaxBatch rows of them a product, each
// weight read once for those rows); attention is causal over the
// sequence's cached positions and the new ones before it, softmax in
// float32. Weights are Tensors, a kernels.DType and a byte slice: f32,
// bf16, Q8_0 and Q4_0 matrices, f32 and bf16 vectors (norm scales,
// biases); nothing is copied or widened into a new matrix, and nothing is
// kept past the call.
//
// # Wiring into the generator
//
// zinf-generate streams a model layer by layer through its pinned pool:
// it swaps layer l's tensors in, runs the layer and releases them. With
// the native decoder (contrib/gomlx/generate, Options.Decoder) it does the
// same with Layer in place of the GoMLX layer graph: Begin on the
// embedding layer's views, then, as each layer
// is swapped in, a LayerWeights of views of its pinned buffers, gathered
// by name with a Binding (Binding.Layer with a function from a tensor
// name to the view of its pinned buffer), handed to Layer, and Logits on
// the head's views; the KV cache is a float32 buffer the generator allocates
// (through the runtime's KV cache, in memory or pinned) once per
// generation, or, on NVMe, one entry a layer bound around the layer
// (NewLayerKVCache, KVCache.BindLayer) as zinf's KV cache reads it back
// and writes it behind. Under Options.Decoder auto the generator picks the
// native decoder when the model maps to a Config (for the zoo,
// contrib/gomlx/nativecheck.ZooConfig; in-out or out-in weights) and the
// sampling is greedy, and keeps the GoMLX path otherwise, saying why.
//
// # Caveats
//
//   - Weights in the zoo's default in-out layout (its dense layers without
//     WithTransposedWeights, and its output head always) run on
//     kernels.MatMulInOut: f32 and bf16 only (a block format there is an
//     error naming the weight), each output's sum in another order than
//     the same weights stored out-in give (the logits agree within float32
//     rounding, not bit for bit). Hugging Face and GGUF weights are
//     out-in.
//   - Attention is split by (position, head) over the kernels pool's
//     workers (Pool.Parallel) when there is enough of it; its scores and
//     weighted sums of values run on the kernels' strided products
//     (kernels.Dots, kernels.WeightedSum: MatMul's and MatMulInOut's
//     bits), its softmax, and the norms, RoPE and activations, are
//     scalar Go, the latter on one goroutine. A layer's queries, keys and
//     values (and gate and up projections) are one kernels.Pool.MatMuls
//     call. A decoding step allocates nothing once its scratch has grown.
//   - Q8_0 and Q4_0 matrices multiply the activations quantized to
//     blocks of 32 8-bit integers, with integer dot products, as
//     llama.cpp computes them (decoder/kernels' documentation defines the
//     bits): the logits are not those of the same weights widened to f32
//     but within a tolerance of them (5% of the largest logit in the
//     tests, 2.5% seen), and greedy tokens may part at a near tie.
//   - A Decoder's results do not depend on the number of workers, nor on
//     whether the prompt is fed as a prefill or a token at a time: the
//     same bits (the tests check both).
//   - The logits are those of the last new position only.
//   - Not covered: sliding windows, soft caps, QK norms (Gemma 3, Qwen 3),
//     RoPE scaling, per-layer embeddings, KV-shared layers.
package decoder

// Package gguf reads and writes GGUF files, llama.cpp's model format, so
// that zinf's native decoder (package decoder) computes on the files CPU
// users already have, read where they lie.
//
// # Reading
//
// Open (or Read on any io.ReaderAt) reads and checks the header only:
// magic, version (2 or 3), the metadata (every value type, arrays
// included) and the tensor infos (name, dimensions, type, offset), then
// where the data section starts (general.alignment). Every count, length
// and offset is bounded by the bytes left in the file and by this
// package's limits (MaxTensors, MaxKV, MaxStringBytes, MaxArrayLen,
// MaxHeaderMemory, ...) before anything is allocated for it; each
// tensor's data must lie inside the file at an aligned offset, and no two
// tensors may overlap. A bad header gives a *FormatError naming the file,
// the byte offset, the field, its value and what is allowed (errors.Is
// ErrFormat).
//
// No tensor data is read by Open: TensorInfo.Offset and Bytes say where
// each tensor lies, Section gives an io.SectionReader of it (to map it or
// read it piecewise), and ReadData reads it into memory the caller owns (a
// pinned buffer, say). Tensors of types f32, bf16, q8_0 and q4_0 are
// handed out as stored (ggml's q8_0 and q4_0 blocks are decoder/kernels'
// layouts); f16 is widened to f32, since the decoder has no f16 kernel.
// The other ggml types (the k-quants, i-quants, ...) are listed with
// their names and sizes, and ReadData refuses them (ErrUnsupported).
//
//	f, _ := gguf.Open("model.gguf")
//	defer f.Close()
//	m, _ := f.Model()                          // the llama architecture's decoder.Config
//	mw, layers, _ := f.Weights(m.Config, nil)  // or an allocator from a pinned pool
//	d, _ := decoder.New(m.Config, nil)
//	// d.Begin(cache, tokens, pos, &mw); d.Layer(l, &layers[l]) ...; d.Logits(&mw, out)
//
// Model maps the llama architecture's metadata onto decoder.Config and
// checks every tensor the configuration needs (its name under
// decoder.GGUFNames, its shape, its type). Tokenizer reads the
// tokenizer.ggml.* metadata (model, tokens, scores, types, merges, the
// special ids); there is no encoder: a caller feeds token ids.
//
// # RoPE
//
// llama.cpp's converter permutes the query and key rows of the llama
// architecture within each head so that ggml's normal RoPE, which
// rotates adjacent pairs (2i, 2i+1), computes what Hugging Face's Llama
// computes by rotating (i, i + d/2): the decoder reads such a file with
// Config.RoPEInterleaved and the rows as stored. InterleaveRoPERows does
// the permutation, for a writer converting Hugging Face weights.
//
// # Writing
//
// Writer writes version 3 files (metadata, tensors of any known type,
// the data aligned), tensor data asked for only as it is written, for
// tests and benchmarks: SetLlama writes the llama architecture's keys and
// SetByteVocab a minimal SentencePiece vocabulary llama.cpp accepts.
//
// # Caveats
//
//   - Little-endian files only (a big-endian one is recognised and
//     refused); version 1 is refused.
//   - Only the llama architecture maps to a decoder.Config; RoPE scaling,
//     mixtures of experts and per-layer head counts are refused by name.
//   - No BPE or SentencePiece encoder.
package gguf

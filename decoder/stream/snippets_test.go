package stream_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/zinfio/zinf/config"
	"github.com/zinfio/zinf/decoder"
	"github.com/zinfio/zinf/decoder/kernels"
	"github.com/zinfio/zinf/decoder/stream"
)

// streamGreedy is docs/gguf.md's streamed decoding: steps greedy tokens
// after prompt, the weights of the GGUF file at path streamed through the
// tiers cfg describes.
func streamGreedy(ctx context.Context, path string, cfg *config.Config, prompt []int32, steps int) ([]int32, error) {
	m, err := stream.Open(ctx, path, cfg, stream.Options{})
	if err != nil {
		return nil, err
	}
	defer m.Close()
	defer m.EndPasses() // what the last step prefetched for a step that does not come
	c := m.Config()
	d, err := decoder.New(c, nil)
	if err != nil {
		return nil, err
	}
	kvh := c.KVHeads
	if kvh == 0 {
		kvh = c.Heads
	}
	n := c.Layers * (len(prompt) + steps) * kvh * c.HeadDim
	cache, err := decoder.NewKVCache(c, 1, len(prompt)+steps, make([]float32, n), make([]float32, n))
	if err != nil {
		return nil, err
	}
	logits := make([]float32, c.Vocab)
	tokens, pos := [][]int32{prompt}, []int{0}
	var out []int32
	for range steps {
		if err := m.Pass(ctx, d, cache, tokens, pos, logits); err != nil {
			return nil, err
		}
		pos[0] += len(tokens[0])
		next := int32(slices.Index(logits, slices.Max(logits)))
		out = append(out, next)
		tokens = [][]int32{{next}}
	}
	return out, nil
}

// TestSnippetStreamGreedy runs the documented function and wants the
// tokens of the weights read whole.
func TestSnippetStreamGreedy(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	dir := t.TempDir()
	path, _ := writeModel(t, dir, kernels.Q8_0, true)
	prompt := []int32{1, 80, 81}
	got, err := streamGreedy(ctx, path, streamConfig(t, dir, 8<<20, 0), prompt, 6)
	if err != nil {
		t.Fatal(err)
	}
	want := inMemory(t, path, [][]int32{prompt}, 5)
	for i, l := range want {
		if id := int32(slices.Index(l, slices.Max(l))); got[i] != id {
			t.Fatalf("token %d: streamed %d, in memory %d (%v)", i, got[i], id, got)
		}
	}
}

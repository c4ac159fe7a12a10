package generate_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/gomlx/compute"
	"github.com/gomlx/compute/dtypes"

	"github.com/zinfio/zinf/config"
	"github.com/zinfio/zinf/contrib/gomlx/generate"
)

// generateText is README.md's "Generate from a model larger than RAM" and
// docs/generation.md's first code, line for line: docs/snippets_test.go in
// zinf's module compares them, and TestDocsSnippets runs it.
func generateText(ctx context.Context, backend compute.Backend, fn generate.ModelFn, configFile, weightsFile string, prompts [][]int32) ([][]int32, error) {
	cfg, err := config.Load(configFile) // offload_param: nvme; zinf.tiers.cpu_pinned_bytes: the pool
	if err != nil {
		return nil, err
	}
	// Tensors named by variable path; generate.HFNames reads Hugging Face's names.
	weights, err := generate.SafetensorsWeights(nil, weightsFile)
	if err != nil {
		return nil, err
	}
	g, err := generate.Open(ctx, backend, cfg, fn, weights, generate.Options{}) // reads them in place
	if err != nil {
		return nil, err
	}
	defer g.Close()
	res, err := g.Generate(ctx, prompts, generate.Sampling{MaxNewTokens: 8}, nil) // greedy
	if err != nil {
		return nil, err
	}
	return res.Tokens, nil // res.BytesRead, res.IOWait, res.DecodeTokensPerSecond() say how it went
}

// TestDocsSnippets runs generateText on a small random model written by
// WriteRandomModel: its greedy tokens equal GoMLX's in-memory generator's.
func TestDocsSnippets(t *testing.T) {
	ctx := watchdog(t, 3*time.Minute)
	b := backend(t)
	defer b.Finalize()
	dir := t.TempDir()
	fn := tiny(dtypes.Float32, 2)
	file := filepath.Join(dir, "model.safetensors")
	if _, err := generate.WriteRandomModel(ctx, b, fn, file, 7); err != nil {
		t.Fatal(err)
	}
	cfgFile := filepath.Join(dir, "ds_config.json")
	js := fmt.Sprintf(`{"zero_optimization": {"stage": 3, "offload_param": {"device": "nvme", "nvme_path": %q, "max_in_cpu": 0}},
 "zinf": {"tiers": {"cpu_pinned_bytes": "16MiB"}, "bandwidth": {"probe": false}}}`, dir)
	if err := os.WriteFile(cfgFile, []byte(js), 0o644); err != nil {
		t.Fatal(err)
	}
	prompts := [][]int32{{1, 2, 3}, {4, 5, 6}}
	got, err := generateText(ctx, b, fn, cfgFile, file, prompts)
	if err != nil {
		t.Fatalf("generateText: %v", err)
	}
	w, err := generate.SafetensorsWeights(nil, file)
	if err != nil {
		t.Fatal(err)
	}
	want, err := generate.InMemory(ctx, b, fn, w, prompts, generate.Sampling{MaxNewTokens: 8})
	if err != nil {
		t.Fatal(err)
	}
	for i := range want {
		if !slices.Equal(got[i], want[i]) {
			t.Fatalf("prompt %d: %v through zinf, %v in memory", i, got[i], want[i])
		}
	}
}

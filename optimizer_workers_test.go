package zinf_test

import (
	"runtime"
	"testing"

	"github.com/zinfio/zinf"
)

// TestOptimizerWorkersConfig: zinf.optimizer_workers reaches the
// optimizer's Options.UpdateWorkers; absent, the optimizer uses
// GOMAXPROCS.
func TestOptimizerWorkersConfig(t *testing.T) {
	for _, tc := range []struct{ key, want int }{{0, runtime.GOMAXPROCS(0)}, {3, 3}} {
		c, _ := testConfig(t)
		c.Zinf.OptimizerWorkers = tc.key
		rt, err := zinf.Open(c, oneTensor("w", 1000), zinf.Options{})
		if err != nil {
			t.Fatal(err)
		}
		got := rt.Optimizer.Options().UpdateWorkers
		if err := rt.Close(); err != nil {
			t.Fatal(err)
		}
		if got != tc.want {
			t.Errorf("zinf.optimizer_workers %d: the optimizer splits updates over %d workers, want %d", tc.key, got, tc.want)
		}
	}
}

package zinf_test

import (
	"fmt"
	"testing"

	"github.com/zinfio/zinf/internal/test/testenv"
)

// forSeeds runs run as a subtest named by its seed for each of n random
// seeds (short under -short, stress under ZINF_STRESS=1, the one seed
// ZINF_TEST_SEED names), i counting from 0, each logging how to reproduce
// it.
func forSeeds(t *testing.T, n, short, stress int, run func(t *testing.T, i int, seed uint64)) {
	t.Helper()
	if testing.Short() {
		n = short
	}
	for i, seed := range testenv.Seeds(t, n, stress) {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			t.Logf("seed %d (reproduce with %s=%d)", seed, testenv.SeedEnv, seed)
			run(t, i, seed)
		})
	}
}

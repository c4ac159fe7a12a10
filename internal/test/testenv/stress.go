package testenv

import (
	"os"
	"strconv"
	"testing"
	"time"
)

// StressEnv is the variable `make stress` sets: tests with a knob run
// longer under it (more seeds, more kill points, more iterations).
const StressEnv = "ZINF_STRESS"

// Stress reports whether the tests run under `make stress`.
func Stress() bool { return os.Getenv(StressEnv) != "" }

// Scale returns n, or stress when the tests run under `make stress`.
func Scale(n, stress int) int {
	if Stress() {
		return stress
	}
	return n
}

// SeedEnv names the seed that repeats one run of a randomized test.
const SeedEnv = "ZINF_TEST_SEED"

// Seeds returns the seeds a randomized test runs: n consecutive ones
// from the clock (stress of them under `make stress`), or only the one
// ZINF_TEST_SEED names. A malformed ZINF_TEST_SEED fails the test.
func Seeds(t testing.TB, n, stress int) []uint64 {
	t.Helper()
	n = Scale(n, stress)
	base := uint64(time.Now().UnixNano())
	if s := os.Getenv(SeedEnv); s != "" {
		v, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("%s=%q: want an unsigned integer: %v", SeedEnv, s, err)
		}
		base, n = v, 1
	}
	seeds := make([]uint64, n)
	for i := range seeds {
		seeds[i] = base + uint64(i)
	}
	return seeds
}

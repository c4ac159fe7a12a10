package testenv

import "os"

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

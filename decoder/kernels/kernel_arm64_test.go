package kernels

import (
	"os"
	"slices"
	"testing"

	"golang.org/x/sys/cpu"
)

// TestNEONKernelsFollowTheCPU requires the arm64 kernels to be the
// CPU's: the SDOT kernel first where the CPU has the dot product
// instructions and absent where it lacks them (an SDOT there is an
// illegal instruction), the ARMv8.0 NEON kernel always. With
// ZINF_TEST_DOTPROD set (1 or 0, as internal/asmgen/mutants.sh sets it
// for the CPU it has qemu-aarch64 emulate) the test also requires the
// detection to say so, so that a run meant to test one kernel cannot
// quietly test the other.
func TestNEONKernelsFollowTheCPU(t *testing.T) {
	want := []string{KernelNEON, KernelScalar}
	if cpu.ARM64.HasASIMDDP {
		want = slices.Insert(want, 0, KernelNEONDot)
	}
	if got := Kernels(); !slices.Equal(got, want) {
		t.Fatalf("Kernels() = %q, want %q (dot product instructions: %v)", got, want, cpu.ARM64.HasASIMDDP)
	}
	switch v := os.Getenv("ZINF_TEST_DOTPROD"); v {
	case "":
	case "0", "1":
		if cpu.ARM64.HasASIMDDP != (v == "1") {
			t.Fatalf("ZINF_TEST_DOTPROD=%s, but the CPU's dot product instructions detected: %v", v, cpu.ARM64.HasASIMDDP)
		}
	default:
		t.Fatalf("ZINF_TEST_DOTPROD=%q: allowed are 0, 1 or unset", v)
	}
	t.Logf("kernels %q", Kernels())
}

package optimizer

import "golang.org/x/sys/cpu"

// Adam8AVX512Candidate returns a kernel whose 8-bit Adam body is the
// generated AVX-512 one (adam8AVX512, not dispatched yet: see
// kernel_amd64.go), and whether this CPU runs it.
func Adam8AVX512Candidate() (Kernel, bool) {
	if !cpu.X86.HasAVX512F {
		return Kernel{}, false
	}
	return Kernel{&kernel{name: "avx512-adam8-candidate", lanes: 16, adam8: adam8AVX512}}, true
}

package backendinfo

import "golang.org/x/sys/cpu"

func cpuHasSIMD() bool { return cpu.X86.HasAVX2 }

func cpuSIMDName() string {
	if cpu.X86.HasAVX512F {
		return "AVX-512"
	}
	return "AVX2"
}

// Package backendinfo says which of GoMLX's Go-backend kernels a program
// was built with, and warns once when a CPU that has SIMD units runs the
// portable loops instead.
//
// The Go backend of github.com/gomlx/compute has AVX2 and AVX-512 matmul
// kernels only when the program is built with Go's SIMD experiment
// (GOEXPERIMENT=simd) for amd64; without it every matmul runs portable Go
// loops, 20-40x slower on the CPUs zinf was measured on. Nothing at run
// time can switch them on, so the warning says how to rebuild.
package backendinfo

import (
	"log/slog"
	"strings"
	"sync"

	"github.com/gomlx/compute"
)

// isGoBackend reports whether backend is GoMLX's Go backend, whose Name
// is "Go Backend" (compute v0.1.2); its config name is "go".
func isGoBackend(backend compute.Backend) bool {
	return backend != nil && strings.HasPrefix(backend.Name(), "Go ")
}

// SIMD reports whether this program was built with the Go backend's SIMD
// kernels (amd64 built with GOEXPERIMENT=simd).
func SIMD() bool { return simdBuild }

// Build names the build for reports: "simd" or "portable".
func Build() string {
	if simdBuild {
		return "simd"
	}
	return "portable"
}

// PortableNote is the warning for a program that runs the Go backend's
// portable loops on a CPU whose SIMD units the SIMD build would use, and
// whether it applies to backend (false: SIMD build, another backend, or a
// CPU without AVX2).
func PortableNote(backend compute.Backend) (string, bool) {
	if simdBuild || !isGoBackend(backend) || !cpuHasSIMD() {
		return "", false
	}
	return "GoMLX's Go backend runs its portable matmul loops: this program was built without " +
		"GOEXPERIMENT=simd, and this CPU has " + cpuSIMDName() + ". Rebuild with " +
		"`GOEXPERIMENT=simd go build` (Go 1.26+, amd64) for its SIMD kernels: a [512,2048]x[2048,2048] " +
		"float32 MatMul ran at 1.85 GFLOP/s portable and 39.4 GFLOP/s with SIMD on a 2-vCPU AMD EPYC", true
}

var warned sync.Once

// WarnPortable logs PortableNote's warning once per process (log nil:
// slog.Default()) when it applies to backend.
func WarnPortable(log *slog.Logger, backend compute.Backend) {
	msg, ok := PortableNote(backend)
	if !ok {
		return
	}
	warned.Do(func() {
		if log == nil {
			log = slog.Default()
		}
		log.Warn("zinf: " + msg)
	})
}

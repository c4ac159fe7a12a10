//go:build !(amd64 && goexperiment.simd)

package backendinfo

const simdBuild = false

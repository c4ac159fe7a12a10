// Package cudatest builds the stand-in CUDA driver library the tests of
// accel/cuda and gds load instead of libcuda.so.1, and reads the counters it
// keeps. It is for tests only.
//
// The stand-in (accel/cuda/testdata/cuda_standin.c) exports the driver entry
// points zinf calls, backed by host memory. Its behaviour is steered by
// environment variables read on every call: STANDIN_FAIL=name:code,...
// makes entry points fail with a CUresult, STANDIN_CUDA_DEVICES and
// STANDIN_CUDA_TOTAL set the device count and memory, and STANDIN_CUDA_STATE
// names a file the stand-in rewrites with its live counters after every
// change (the cuFile stand-in in gds/testdata does the same with
// STANDIN_CUFILE_STATE).
package cudatest

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
)

// RequireCgo skips the test when the binary was built without cgo: the
// bindings load libraries with dlopen, which needs cgo.
func RequireCgo(t testing.TB) {
	t.Helper()
	if !CgoEnabled {
		t.Skip("built with CGO_ENABLED=0: the CUDA and cuFile bindings load their libraries with dlopen through cgo, so the stand-in library cannot be loaded")
	}
}

// Source returns the path of a file in accel/cuda/testdata.
func Source(name string) string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..", "..", "accel", "cuda", "testdata", name)
}

// CompileShared compiles the C file src into a shared library in a fresh
// temporary directory and returns the library's path. It skips the test when
// cgo is off or gcc is absent, and fails it when the compiler does.
func CompileShared(t testing.TB, src, name string) string {
	t.Helper()
	RequireCgo(t)
	gcc, err := exec.LookPath("gcc")
	if err != nil {
		t.Skipf("gcc not found (%v): the stand-in library %s cannot be built", err, filepath.Base(src))
	}
	out := filepath.Join(t.TempDir(), name)
	cmd := exec.Command(gcc, "-shared", "-fPIC", "-O1", "-Wall", "-Werror", "-o", out, src, "-lpthread")
	if msg, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("building %s: %v\n%s", src, err, msg)
	}
	return out
}

// Build compiles the stand-in CUDA driver library and returns its path.
func Build(t testing.TB) string {
	t.Helper()
	return CompileShared(t, Source("cuda_standin.c"), "libcuda_standin.so")
}

// StateFile points the environment variable env (STANDIN_CUDA_STATE or
// STANDIN_CUFILE_STATE) at a file in a temporary directory for the rest of
// the test and returns the file's path.
func StateFile(t testing.TB, env string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), strings.ToLower(env))
	t.Setenv(env, p)
	return p
}

// ReadState parses a state file ("key value" lines). A missing file reads
// as no counters.
func ReadState(t testing.TB, path string) map[string]int64 {
	t.Helper()
	m := map[string]int64{}
	f, err := os.Open(path)
	if os.IsNotExist(err) {
		return m
	}
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), " ")
		if !ok {
			continue
		}
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			t.Fatalf("state file %s: %q: %v", path, sc.Text(), err)
		}
		m[k] = n
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return m
}

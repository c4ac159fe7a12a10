// Package testenv holds what zinf's tests share about their environment:
// which I/O backends a test run must cover.
//
// Tests build a matrix of backends and drop those this machine cannot run,
// which keeps "go test" green on a laptop without io_uring. On CI that
// leniency is a trap: a probe that misfires would silently shrink the matrix
// to posix. Setting ZINF_REQUIRE_BACKENDS (a comma-separated list such as
// "uring,libaio,posix") turns a required backend that is unavailable into a
// test failure naming the backend and why it is unavailable, instead of a
// skip.
package testenv

import (
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
)

// RequireBackendsEnv is the environment variable listing the backends a
// test run must not skip.
const RequireBackendsEnv = "ZINF_REQUIRE_BACKENDS"

// KnownBackends are the names ZINF_REQUIRE_BACKENDS may list: the aio
// backends, "gds" (GPUDirect Storage through cuFile), "mpi" (Open MPI:
// the comm binding and the multi-process training tests under mpirun)
// and "nccl" (NCCL on a GPU).
var KnownBackends = []string{"uring", "libaio", "posix", "gds", "mpi", "nccl"}

// RequiredBackends parses ZINF_REQUIRE_BACKENDS. Names are trimmed and
// lower-cased; empty entries are ignored. A name outside KnownBackends is
// an error naming the variable, the value and what is allowed, so a typo
// cannot quietly require nothing.
func RequiredBackends() ([]string, error) {
	return parseRequired(os.Getenv(RequireBackendsEnv))
}

func parseRequired(v string) ([]string, error) {
	var out []string
	for _, f := range strings.Split(v, ",") {
		name := strings.ToLower(strings.TrimSpace(f))
		if name == "" {
			continue
		}
		if !slices.Contains(KnownBackends, name) {
			return nil, fmt.Errorf("%s=%q: unknown backend %q (allowed: a comma-separated list of %s)",
				RequireBackendsEnv, v, name, strings.Join(KnownBackends, ", "))
		}
		if !slices.Contains(out, name) {
			out = append(out, name)
		}
	}
	return out, nil
}

// Required reports whether ZINF_REQUIRE_BACKENDS lists backend. It fails
// the test when the variable is malformed.
func Required(t testing.TB, backend string) bool {
	t.Helper()
	req, err := RequiredBackends()
	if err != nil {
		t.Fatal(err)
	}
	return slices.Contains(req, backend)
}

// SkipUnavailable ends the test when backend is unavailable (err != nil):
// it fails it when ZINF_REQUIRE_BACKENDS lists the backend, and skips it
// otherwise. With err == nil it does nothing.
func SkipUnavailable(t testing.TB, backend string, err error) {
	t.Helper()
	if err == nil {
		return
	}
	if Required(t, backend) {
		t.Fatalf("backend %s is required (%s=%q) but unavailable: %v", backend, RequireBackendsEnv, os.Getenv(RequireBackendsEnv), err)
	}
	t.Skipf("backend %s unavailable here: %v", backend, err)
}

// Backends returns the candidates that are available, as reported by
// available (nil means it runs here), in the candidates' order. An
// unavailable candidate is logged and left out, unless ZINF_REQUIRE_BACKENDS
// lists it: then the test fails (and the rest of the matrix still runs). A
// required backend that is not among the candidates is ignored: the list
// names what the run must cover, and each test covers its own candidates.
func Backends(t testing.TB, candidates []string, available func(string) error) []string {
	t.Helper()
	req, err := RequiredBackends()
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, b := range candidates {
		if err := available(b); err != nil {
			if slices.Contains(req, b) {
				t.Errorf("backend %s is required (%s=%q) but unavailable: %v", b, RequireBackendsEnv, os.Getenv(RequireBackendsEnv), err)
			} else {
				t.Logf("backend %s unavailable here: %v", b, err)
			}
			continue
		}
		out = append(out, b)
	}
	return out
}

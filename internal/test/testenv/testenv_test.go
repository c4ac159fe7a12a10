package testenv_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/zinfio/zinf/internal/test/testenv"
)

func TestRequiredBackends(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want []string
		err  string
	}{
		{in: "", want: nil},
		{in: "uring,libaio,posix", want: []string{"uring", "libaio", "posix"}},
		{in: " Uring , ,posix,uring", want: []string{"uring", "posix"}},
		{in: "gds", want: []string{"gds"}},
		{in: "uring,urin", err: `unknown backend "urin"`},
	} {
		t.Setenv(testenv.RequireBackendsEnv, tc.in)
		got, err := testenv.RequiredBackends()
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) || !strings.Contains(err.Error(), testenv.RequireBackendsEnv) {
				t.Errorf("RequiredBackends() with %q = %v, %v; want an error containing %q and the variable name", tc.in, got, err, tc.err)
			}
			continue
		}
		if err != nil || strings.Join(got, ",") != strings.Join(tc.want, ",") {
			t.Errorf("RequiredBackends() with %q = %v, %v; want %v", tc.in, got, err, tc.want)
		}
	}
}

// recorder is a testing.TB that records instead of failing, so the failing
// paths of the helpers can be checked.
type recorder struct {
	testing.TB
	errors, logs []string
	fatal        bool
}

func (r *recorder) Helper()                           {}
func (r *recorder) Errorf(format string, args ...any) { r.errors = append(r.errors, format) }
func (r *recorder) Logf(format string, args ...any)   { r.logs = append(r.logs, format) }
func (r *recorder) Fatal(args ...any)                 { r.fatal = true; panic(r) }

func TestBackendsRequire(t *testing.T) {
	avail := func(b string) error {
		if b == "libaio" {
			return errors.New("no AIO here")
		}
		return nil
	}
	all := []string{"uring", "libaio", "posix"}

	t.Setenv(testenv.RequireBackendsEnv, "")
	r := &recorder{TB: t}
	if got := testenv.Backends(r, all, avail); strings.Join(got, ",") != "uring,posix" || len(r.errors) != 0 || len(r.logs) != 1 {
		t.Fatalf("unset: got %v, errors %v, logs %v; want uring,posix, no errors and one log line", got, r.errors, r.logs)
	}

	t.Setenv(testenv.RequireBackendsEnv, "uring,libaio,posix")
	r = &recorder{TB: t}
	if got := testenv.Backends(r, all, avail); strings.Join(got, ",") != "uring,posix" || len(r.errors) != 1 {
		t.Fatalf("libaio required: got %v, errors %v; want uring,posix and one error", got, r.errors)
	}

	t.Setenv(testenv.RequireBackendsEnv, "uring,bogus")
	r = &recorder{TB: t}
	func() {
		defer func() { _ = recover() }()
		testenv.Backends(r, all, avail)
	}()
	if !r.fatal {
		t.Fatal("an unknown backend in the variable did not fail the test")
	}
}

func TestSeeds(t *testing.T) {
	t.Setenv(testenv.StressEnv, "")
	t.Setenv(testenv.SeedEnv, "")
	s := testenv.Seeds(t, 3, 50)
	if len(s) != 3 || s[1] != s[0]+1 || s[2] != s[0]+2 {
		t.Fatalf("testenv.Seeds(3, 50) = %v, want 3 consecutive seeds", s)
	}
	t.Setenv(testenv.StressEnv, "1")
	if s := testenv.Seeds(t, 3, 50); len(s) != 50 {
		t.Fatalf("under stress: %d seeds, want 50", len(s))
	}
	t.Setenv(testenv.SeedEnv, "42")
	if s := testenv.Seeds(t, 3, 50); len(s) != 1 || s[0] != 42 {
		t.Fatalf("%s=42: %v, want [42]", testenv.SeedEnv, s)
	}
}

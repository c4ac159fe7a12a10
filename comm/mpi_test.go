package comm_test

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/zinfio/zinf/internal/test/mpitest"
)

// TestMPI launches the MPI binding's rank tests (TestMPIRank, built with
// the mpi tag) under mpirun: the shared contract check at 1 to 4 ranks
// (bit for bit against the rank-ordered reference), MPI's native
// reductions (within a tolerance), and failures — a rank that aborts
// with an error, a rank killed with SIGKILL, a rank stopped with SIGSTOP
// (named by the heartbeat check, 2 s in this case), a rank whose context
// ends — each of which must end every other rank's collective with an
// error naming the failed rank, within seconds.
func TestMPI(t *testing.T) {
	mpitest.Require(t)
	bin := mpitest.Build(t, "./comm", t.TempDir(), true)
	// Each rank writes its outcome line into a file of its own too
	// (mpirun may drop the output of a job it ends); res.Output gets
	// those lines appended.
	run := func(t *testing.T, n int, kase string) mpitest.Result {
		t.Helper()
		dir := t.TempDir()
		res := mpitest.Run(t, 90*time.Second, n, []string{"ZINF_MPI_CASE=" + kase, "ZINF_MPI_OUT=" + dir}, bin, "-test.run", "^TestMPIRank$", "-test.v")
		if res.TimedOut {
			t.Fatalf("%s at %d ranks: mpirun still running after %v:\n%s", kase, n, res.Duration, res.Output)
		}
		res.Output += "\n--- rank files:\n"
		for r := range n {
			b, _ := os.ReadFile(filepath.Join(dir, fmt.Sprintf("rank-%d", r)))
			res.Output += string(b)
		}
		return res
	}
	lines := func(out, pattern string) []string {
		return regexp.MustCompile(pattern).FindAllString(out, -1)
	}
	// okRanks counts the ranks that reported success.
	okRanks := func(out string) int {
		seen := map[string]bool{}
		for _, l := range lines(out, `RANK \d+ OK`) {
			seen[l] = true
		}
		return len(seen)
	}
	for n := 1; n <= 4; n++ {
		t.Run(fmt.Sprintf("conformance/%d", n), func(t *testing.T) {
			res := run(t, n, "conformance")
			if res.Err != nil || okRanks(res.Output) != n {
				t.Fatalf("%v\n%s", res.Err, res.Output)
			}
		})
	}
	t.Run("native/3", func(t *testing.T) {
		res := run(t, 3, "native")
		if res.Err != nil || okRanks(res.Output) != 3 {
			t.Fatalf("%v\n%s", res.Err, res.Output)
		}
	})
	// Failures: every surviving rank reports an error naming the failed
	// rank (and the job ends well before the stall timeout of 30 s).
	for _, c := range []struct {
		kase   string
		failed int
		why    string
	}{
		{"abort", 1, "disk full on rank 1: no space left on device"},
		{"kill", 1, "process .* ended"},
		{"stop", 1, "the rank is silent: no heartbeat from its process for"},
		{"context", 0, "context deadline exceeded"},
	} {
		t.Run(c.kase, func(t *testing.T) {
			res := run(t, 3, c.kase)
			if res.Err == nil {
				t.Fatalf("the job succeeded:\n%s", res.Output)
			}
			want := regexp.MustCompile(fmt.Sprintf(`RANK (\d+) ERROR (after \S+: )?comm: [a-z-]+: rank %d failed: .*%s`, c.failed, c.why))
			got := want.FindAllStringSubmatch(res.Output, -1)
			ranks := map[string]bool{}
			for _, m := range got {
				ranks[m[1]] = true
			}
			for r := range 3 {
				if r == 1 && (c.kase == "kill" || c.kase == "stop") {
					continue
				}
				if !ranks[fmt.Sprint(r)] {
					t.Errorf("rank %d did not report rank %d's failure (%s)", r, c.failed, c.why)
				}
			}
			if res.Duration > 20*time.Second {
				t.Errorf("the job took %v to end", res.Duration)
			}
			if t.Failed() {
				t.Logf("output:\n%s", res.Output)
			}
			t.Logf("%s: job ended after %v; %s", c.kase, res.Duration.Round(time.Millisecond), strings.Join(lines(res.Output, `RANK \d+ ERROR after \S+`), "; "))
		})
	}
}

// TestStressMPI (ZINF_STRESS=1, make stress): the contract check with
// chunks up to 100000 elements and 600 rounds, at 2 to 6 ranks, a new
// seed each run.
func TestStressMPI(t *testing.T) {
	if os.Getenv("ZINF_STRESS") == "" {
		t.Skip("ZINF_STRESS=1 (make stress) runs it")
	}
	mpitest.Require(t)
	bin := mpitest.Build(t, "./comm", t.TempDir(), true)
	seed := time.Now().UnixNano()
	for n := 2; n <= 6; n++ {
		res := mpitest.Run(t, 10*time.Minute, n, []string{"ZINF_MPI_CASE=stress", fmt.Sprintf("ZINF_MPI_SEED=%d", seed+int64(n))}, bin, "-test.run", "^TestMPIRank$")
		if res.Err != nil || strings.Count(res.Output, " OK") < n {
			t.Fatalf("%d ranks, seed %d: %v\n%s", n, seed+int64(n), res.Err, res.Output)
		}
	}
}

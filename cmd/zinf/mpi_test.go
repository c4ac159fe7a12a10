package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/zinfio/zinf"
	"github.com/zinfio/zinf/checkpoint"
	"github.com/zinfio/zinf/config"
	"github.com/zinfio/zinf/examples/train"
	"github.com/zinfio/zinf/internal/test/mpitest"
)

// mpiTrain is zinf train's model and run for the MPI tests: small, two
// micro-steps per step (the embedded config's accumulation), a little
// simulated compute so that gathers overlap it.
var mpiTrainArgs = []string{"train", "--layers", "3", "--width", "40", "--batch", "4", "--json", "--quiet", "--compute-ms-per-layer", "0.5"}

// trainJSON finds zinf train's JSON result in a job's output (rank 0
// prints it; the other ranks print nothing on success).
func trainJSON(t *testing.T, out string) *train.Result {
	t.Helper()
	for _, line := range strings.Split(out, "\n") {
		if strings.HasPrefix(line, `{"steps"`) {
			var r train.Result
			if err := json.Unmarshal([]byte(line), &r); err != nil {
				t.Fatalf("parsing %q: %v", line, err)
			}
			return &r
		}
	}
	t.Fatalf("no JSON result in the output:\n%s", out)
	return nil
}

// inProcess runs zinf train in this process at world size world (the
// ranks simulated in one process) and returns its result.
func inProcess(t *testing.T, world int, args ...string) *train.Result {
	t.Helper()
	t.Setenv("WORLD_SIZE", fmt.Sprint(world))
	var out, errb bytes.Buffer
	if code := run(append(append([]string{}, mpiTrainArgs...), args...), &out, &errb); code != 0 {
		t.Fatalf("zinf train %q at world %d: exit %d\n%s%s", args, world, code, out.String(), errb.String())
	}
	return trainJSON(t, out.String())
}

// mpiJob runs this test binary as zinf with args on n ranks under
// mpirun, env added to every rank's.
func mpiJob(t *testing.T, bin string, n int, env []string, args ...string) mpitest.Result {
	t.Helper()
	enc, _ := json.Marshal(append(append([]string{}, mpiTrainArgs...), args...))
	// Not the world size an in-process run of this test set: mpirun's.
	env = append(env, "WORLD_SIZE=", "RANK=")
	res := mpitest.Run(t, 3*time.Minute, n, append(env, childArgsEnv+"="+string(enc)), bin)
	if res.TimedOut {
		t.Fatalf("mpirun -np %d zinf %q: still running after %v:\n%s", n, args, res.Duration, res.Output)
	}
	return res
}

// mpiBinary is this package's test binary built with the mpi tag, built
// once for all the MPI tests of a run: each build links the whole program
// with cgo, which took most of each test's time (a minute on a loaded
// machine). TestMain removes its directory.
var mpiBinary struct {
	once  sync.Once
	dir   string
	path  string
	built bool
}

// mpiTestBinary returns mpiBinary's path, building it on first use; a
// test after a failed build fails too, saying so.
func mpiTestBinary(t *testing.T) string {
	t.Helper()
	mpiBinary.once.Do(func() {
		dir, err := os.MkdirTemp("", "zinf-mpi-test-")
		if err != nil {
			t.Fatal(err)
		}
		mpiBinary.dir = dir
		mpiBinary.path = mpitest.Build(t, "./cmd/zinf", dir, true)
		mpiBinary.built = true
	})
	if !mpiBinary.built {
		t.Fatal("building ./cmd/zinf with -tags mpi failed (see the first MPI test)")
	}
	return mpiBinary.path
}

// TestTrainMPI: zinf train under mpirun -np 1 to 4 (Open MPI, ranks as
// processes, layers gathered and gradients reduce-scattered through
// MPI) ends in the state of the in-process world of the same size and
// of world 1 at the same data-parallel degree, bit for bit, and each
// rank's final state equals in-memory training (--verify).
func TestTrainMPI(t *testing.T) {
	mpitest.Require(t)
	bin := mpiTestBinary(t)
	scratch := t.TempDir()
	for n := 1; n <= 4; n++ {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			res := mpiJob(t, bin, n, nil, "--steps", "3", "--verify", "--dir", scratch)
			if res.Err != nil {
				t.Fatalf("mpirun -np %d: %v\n%s", n, res.Err, res.Output)
			}
			got := trainJSON(t, res.Output)
			if got.BitwiseEqual == nil || !*got.BitwiseEqual || got.Dist == nil || got.Dist.AllEqual == nil || !*got.Dist.AllEqual {
				t.Fatalf("mpirun -np %d differs from in-memory training: %s", n, got.Mismatch)
			}
			if got.World != n || got.Dist.Ranks != n || got.DataParallel != n {
				t.Fatalf("world %d, ranks %d, data-parallel %d; want %d", got.World, got.Dist.Ranks, got.DataParallel, n)
			}
			want := inProcess(t, n, "--steps", "3", "--dir", scratch)
			one := inProcess(t, 1, "--steps", "3", "--dir", scratch, "--data-parallel", fmt.Sprint(n))
			if got.StateSHA256 != want.StateSHA256 || got.StateSHA256 != one.StateSHA256 {
				t.Fatalf("final state: mpirun -np %d %s, in-process world %d %s, world 1 with --data-parallel %d %s",
					n, got.StateSHA256, n, want.StateSHA256, n, one.StateSHA256)
			}
			if got.FinalLoss != want.FinalLoss {
				t.Errorf("final loss %v, in-process %v", got.FinalLoss, want.FinalLoss)
			}
			t.Logf("mpirun -np %d: %s; %s of collectives per step on rank 0, step %.1f ms median", n, got.StateSHA256[:16], fmtBytes(got.Dist.CommBytesPerStep), got.StepMsMedian)
		})
	}
}

// TestTrainMPIClipFP16: with gradient clipping that triggers on every
// step and fp16 loss scaling (the norm and the overflow check reduced
// over the ranks through MPI), mpirun -np 3 ends in the state of the
// in-process world of 3, bit for bit. World 1 at data-parallel degree 3
// may differ: the global norm is summed per rank partition, then over
// the ranks, so its last bits depend on the partitioning; the test says
// whether it did here.
func TestTrainMPIClipFP16(t *testing.T) {
	mpitest.Require(t)
	bin := mpiTestBinary(t)
	scratch := t.TempDir()
	args := []string{"--steps", "4", "--dir", scratch, "--clip", "0.001", "--fp16"}
	res := mpiJob(t, bin, 3, nil, append(args, "--verify")...)
	if res.Err != nil {
		t.Fatalf("mpirun -np 3: %v\n%s", res.Err, res.Output)
	}
	got := trainJSON(t, res.Output)
	if got.BitwiseEqual == nil || !*got.BitwiseEqual {
		t.Fatalf("mpirun -np 3 differs from in-memory training: %s", got.Mismatch)
	}
	if got.ClippedSteps == 0 {
		t.Fatalf("no step was clipped: the test does not exercise the reduced norm")
	}
	want := inProcess(t, 3, args...)
	if got.StateSHA256 != want.StateSHA256 {
		t.Fatalf("final state: mpirun -np 3 %s, in-process world 3 %s", got.StateSHA256, want.StateSHA256)
	}
	one := inProcess(t, 1, append(args, "--data-parallel", "3")...)
	t.Logf("%d of %d steps clipped; world 1 at data-parallel degree 3 equal: %v", got.ClippedSteps, got.Steps, one.StateSHA256 == got.StateSHA256)
}

func fmtBytes(n int64) string { return fmt.Sprintf("%d B", n) }

// failedRanks returns the ranks that reported, in the job's output, an
// error naming rank bad with a cause matching why.
func failedRanks(out string, bad int, why string) map[int]bool {
	re := regexp.MustCompile(fmt.Sprintf(`zinf train: rank (\d+) of \d+: .*rank %d failed: .*%s`, bad, why))
	got := map[int]bool{}
	for _, m := range re.FindAllStringSubmatch(out, -1) {
		var r int
		fmt.Sscan(m[1], &r)
		got[r] = true
	}
	return got
}

// TestTrainMPIKill: one rank of zinf train under mpirun -np 3 is killed
// (SIGKILL) in the middle of a step's backward pass, after the
// checkpoint of step 4: the other ranks exit within seconds with an
// error naming it; the checkpoint is intact; resuming from it at world
// sizes 2 and 4 (and 1, in one process) ends in the state of the run
// that was never interrupted, bit for bit.
func TestTrainMPIKill(t *testing.T) {
	mpitest.Require(t)
	bin := mpiTestBinary(t)
	perStep := 2 * 3 * max(1, config.Default().GradientAccumulationSteps)
	killAndResume(t, bin, 3, 1, 4*perStep+5, 4, []int{2, 4, 1})
}

// TestStressMPIKills (ZINF_STRESS=1, make stress) kills a random rank of
// a job of 2 to 4 ranks at a random reduce-scatter, several times, and
// resumes each at random world sizes.
func TestStressMPIKills(t *testing.T) {
	if os.Getenv("ZINF_STRESS") == "" {
		t.Skip("ZINF_STRESS=1 (make stress) runs it")
	}
	mpitest.Require(t)
	bin := mpiTestBinary(t)
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 1))
	perStep := 2 * 3 * max(1, config.Default().GradientAccumulationSteps)
	for i := range 6 {
		procs := 2 + rng.IntN(3)
		rank := rng.IntN(procs)
		hit := 2*perStep + 1 + rng.IntN(4*perStep) // after the checkpoint of step 2
		saved := (hit - 1) / perStep / 2 * 2       // the last even step done
		t.Run(fmt.Sprintf("%d-procs%d-rank%d-hit%d", i, procs, rank, hit), func(t *testing.T) {
			killAndResume(t, bin, procs, rank, hit, saved, []int{1 + rng.IntN(4), 1 + rng.IntN(4)})
		})
	}
}

// killAndResume runs zinf train for 7 steps on procs ranks with a
// checkpoint every 2 steps and kills rank at its hit-th reduce-scatter;
// the other ranks must report it within seconds, the newest checkpoint
// must be step saved and verify, and resuming it at each world size in
// resume must end in the uninterrupted run's state.
func killAndResume(t *testing.T, bin string, procs, rank, hit, saved int, resume []int) {
	t.Helper()
	scratch, ck := t.TempDir(), filepath.Join(t.TempDir(), "ckpt")
	steps := []string{"--steps", "7", "--dir", scratch}
	whole := inProcess(t, procs, steps...)
	killed := filepath.Join(t.TempDir(), "killed")
	res := mpiJob(t, bin, procs, []string{fmt.Sprintf("%s=%d", childRankEnv, rank), fmt.Sprintf("%s=train/reduce:%d", childKillAtEnv, hit), childKilledEnv + "=" + killed},
		append(steps, "--checkpoint-dir", ck, "--checkpoint-every", "2")...)
	end := time.Now()
	if res.Err == nil {
		t.Fatalf("the job succeeded with rank %d killed:\n%s", rank, res.Output)
	}
	b, err := os.ReadFile(killed)
	if err != nil {
		t.Fatalf("rank %d was not killed (%v):\n%s", rank, err, res.Output)
	}
	at, _ := time.Parse(time.RFC3339Nano, string(b))
	got := failedRanks(res.Output, rank, "gone")
	for r := range procs {
		if r != rank && !got[r] {
			t.Fatalf("rank %d must report rank %d's death; reported: %v\n%s", r, rank, got, res.Output)
		}
	}
	if d := end.Sub(at); d > 15*time.Second {
		t.Errorf("the job ended %v after the kill", d)
	}
	t.Logf("the job ended %v after rank %d was killed", end.Sub(at).Round(time.Millisecond), rank)
	info, err := zinf.LatestCheckpoint(ck)
	if err != nil || info.Step != int64(saved) || info.WorldSize != procs {
		t.Fatalf("latest checkpoint: %+v, %v (want step %d of world %d)", info, err, saved, procs)
	}
	if _, err := checkpoint.Verify(t.Context(), info.Dir); err != nil {
		t.Fatalf("the checkpoint of step %d does not verify: %v", saved, err)
	}
	// Resume from copies of the checkpoint directory at other world sizes.
	for _, n := range resume {
		dir := filepath.Join(t.TempDir(), "ckpt")
		if out, err := exec.Command("cp", "-a", ck, dir).CombinedOutput(); err != nil {
			t.Fatalf("copying the checkpoints: %v %s", err, out)
		}
		args := append(append([]string{}, steps...), "--checkpoint-dir", dir, "--checkpoint-every", "2", "--resume")
		var r *train.Result
		if n == 1 {
			r = inProcess(t, 1, args...)
		} else {
			job := mpiJob(t, bin, n, nil, args...)
			if job.Err != nil {
				t.Fatalf("resume at %d ranks: %v\n%s", n, job.Err, job.Output)
			}
			r = trainJSON(t, job.Output)
		}
		if r.Resumed == nil || r.Resumed.Step != saved || r.DataParallel != procs {
			t.Fatalf("resume at %d ranks: %+v", n, r.Resumed)
		}
		if r.StateSHA256 != whole.StateSHA256 {
			t.Fatalf("resumed at world %d: final state %s, the uninterrupted run %s", n, r.StateSHA256, whole.StateSHA256)
		}
	}
}

// TestTrainMPIStop: one rank of zinf train under mpirun -np 3 is stopped
// (SIGSTOP: its process stays, so nothing sees it die) in the middle of
// a step; with zinf.comm_heartbeat_timeout "2s" in the config the other
// ranks exit within seconds with an error naming it as silent, instead
// of waiting for zinf.comm_stall_timeout (10 minutes).
func TestTrainMPIStop(t *testing.T) {
	mpitest.Require(t)
	bin := mpiTestBinary(t)
	// The embedded config, with the key added.
	var doc map[string]any
	if err := json.Unmarshal(config.DefaultJSON(), &doc); err != nil {
		t.Fatal(err)
	}
	z, _ := doc["zinf"].(map[string]any)
	if z == nil {
		z = map[string]any{}
		doc["zinf"] = z
	}
	z["comm_heartbeat_timeout"] = "2s"
	z["nvme_paths"] = []string{t.TempDir()}
	b, err := json.Marshal(doc)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "ds.json")
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
	stopped := filepath.Join(t.TempDir(), "stopped")
	perStep := 2 * 3 * max(1, config.Default().GradientAccumulationSteps)
	res := mpiJob(t, bin, 3, []string{childRankEnv + "=1", fmt.Sprintf("%s=train/reduce:%d", childKillAtEnv, perStep+2), childStopEnv + "=1", childKilledEnv + "=" + stopped},
		"--config", path, "--steps", "4")
	end := time.Now()
	if res.Err == nil {
		t.Fatalf("the job succeeded with rank 1 stopped:\n%s", res.Output)
	}
	raw, err := os.ReadFile(stopped)
	if err != nil {
		t.Fatalf("rank 1 was not stopped (%v):\n%s", err, res.Output)
	}
	at, _ := time.Parse(time.RFC3339Nano, string(raw))
	// The config's timeout, not comm's default of 10 s, named it.
	got := failedRanks(res.Output, 1, `the rank is silent: no heartbeat from its process for \S+ \(MPIOptions.HeartbeatTimeout 2s\)`)
	if !got[0] || !got[2] {
		t.Fatalf("ranks 0 and 2 must report rank 1 silent; reported: %v\n%s", got, res.Output)
	}
	if d := end.Sub(at); d > 30*time.Second {
		t.Errorf("the job ended %v after rank 1 stopped", d)
	}
	t.Logf("the job ended %v after rank 1 stopped", end.Sub(at).Round(time.Millisecond))
}

// TestTrainMPIFullDisk: rank 2's disk fills in the middle of the run
// (ENOSPC on a write): it fails with the error, and ranks 0 and 1 stop
// with an error naming rank 2 and the cause, within seconds, instead of
// waiting for it.
func TestTrainMPIFullDisk(t *testing.T) {
	mpitest.Require(t)
	bin := mpiTestBinary(t)
	res := mpiJob(t, bin, 3, []string{childRankEnv + "=2", childENOSPCEnv + "=40"}, "--steps", "6", "--dir", t.TempDir())
	if res.Err == nil {
		t.Fatalf("the job succeeded with rank 2's disk full:\n%s", res.Output)
	}
	if !strings.Contains(res.Output, "zinf train: rank 2 of 3:") || !strings.Contains(res.Output, "no space left on device") {
		t.Fatalf("rank 2 does not report its full disk:\n%s", res.Output)
	}
	got := failedRanks(res.Output, 2, "no space left on device")
	if !got[0] || !got[1] {
		t.Fatalf("ranks 0 and 1 must report rank 2's failure and its cause; reported: %v\n%s", got, res.Output)
	}
	if res.Duration > time.Minute {
		t.Errorf("the job took %v", res.Duration)
	}
}

package checkpoint

import (
	"bufio"
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/zinfio/zinf/aio"
	"github.com/zinfio/zinf/internal/base/testhook"
	"github.com/zinfio/zinf/internal/test/faults"
	"github.com/zinfio/zinf/swapper"
)

// crashHelperEnv selects the crash helper mode of the test binary: the
// value is "root|name|seed|mode", mode "sync" or "async".
const crashHelperEnv = "ZINF_CHECKPOINT_CRASH_HELPER"

// crashStageEnv names the commit stage the crash helper stops in until it
// is killed.
const crashStageEnv = "ZINF_CHECKPOINT_CRASH_STAGE"

func TestMain(m *testing.M) {
	if v := os.Getenv(crashHelperEnv); v != "" {
		os.Exit(crashHelper(v))
	}
	if v := os.Getenv(writerHelperEnv); v != "" {
		os.Exit(writerHelper(v))
	}
	if v := os.Getenv(memHelperEnv); v != "" {
		os.Exit(memHelper(v))
	}
	os.Exit(m.Run())
}

// crashHelper saves a 32 MiB checkpoint slowly (every write piece delayed)
// so that the parent can kill it at a random point. It prints START before
// the save and COMMITTED after it.
func crashHelper(arg string) int {
	parts := strings.Split(arg, "|")
	if len(parts) != 4 {
		fmt.Fprintln(os.Stderr, "bad helper argument", arg)
		return 2
	}
	root, name, mode := parts[0], parts[1], parts[3]
	seed, _ := strconv.ParseUint(parts[2], 10, 64)
	// Announce the commit's stages and linger in them; stop for good in
	// the one the parent aims at (crashStageEnv), so its kill lands there
	// however late a loaded machine lets it come.
	target := os.Getenv(crashStageEnv)
	testhook.Set(func(point string) {
		stage, ok := strings.CutPrefix(point, "checkpoint/")
		if !ok || (stage != "before-rename" && stage != "after-rename") {
			return
		}
		fmt.Println(stage)
		if stage == target {
			select {} // until SIGKILL
		}
		time.Sleep(200 * time.Millisecond)
	})
	inj := faults.New(seed, faults.Rule{Kind: faults.Writes, Delay: 10 * time.Millisecond})
	eng, err := aio.New(aio.Options{Direct: aio.DirectOptional, BlockSizeBytes: 256 << 10, IntraOpParallelism: 1, Faults: inj})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	st := patternState(seed, 32<<20)
	opts := SaveOptions{Engine: eng, StagingBytes: 1 << 20, Parallel: 2}
	fmt.Println("START")
	dir := filepath.Join(root, name)
	if mode == "async" {
		s := NewSaver(SaverOptions{})
		h, err := s.SaveAsync(context.Background(), dir, st, opts)
		if err == nil {
			fmt.Println("SNAPSHOT")
			_, err = h.Wait()
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
	} else if _, err := Save(context.Background(), dir, st, opts); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	fmt.Println("COMMITTED")
	return 0
}

// patternState is a checkpoint of about total bytes in three files whose
// bytes are a cheap function of the seed and the offset.
func patternState(seed uint64, total int64) State {
	files := []TensorFile{{Name: "params.safetensors"}, {Name: "optimizer.safetensors"}, {Name: "grads.safetensors"}}
	per := total / 9 / 4 * 4
	for i := range 9 {
		read := func(_ context.Context, dst []byte, off int64) error {
			for j := range dst {
				dst[j] = byte(uint64(off+int64(j))*2654435761>>7) ^ byte(seed) ^ byte(i)
			}
			return nil
		}
		n := per + int64(i)*2 // unaligned sizes
		dt := swapper.BFloat16
		if i%3 == 0 {
			dt, n = swapper.Float32, per
		}
		files[i%3].Tensors = append(files[i%3].Tensors, FromFunc(fmt.Sprintf("layer.%d", i), dt, []int64{n / int64(dt.Size())}, n, read))
	}
	return State{Step: int64(seed), Config: []byte(`{"crash": true}`), Ranks: []RankState{{Files: files}}}
}

func TestCrashSafety(t *testing.T) {
	if testing.Short() {
		t.Skip("subprocess crash test skipped in -short mode")
	}
	seeds := []uint64{1, 2, 3, 4, 5, 6, 7, 9}
	if os.Getenv("ZINF_STRESS") != "" { // make stress: kills at many more points
		seeds = seeds[:0]
		for s := uint64(1); s <= 60; s++ {
			seeds = append(seeds, s)
		}
	}
	if s := os.Getenv("ZINF_CRASH_SEED"); s != "" {
		v, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatal(err)
		}
		seeds = []uint64{v}
	}
	root := t.TempDir()
	oldDir, oldSpecs := func() (string, []spec) {
		rng := rand.New(rand.NewPCG(99, 99))
		specs := makeSpecs(rng, []string{"params.safetensors"}, []int{1 << 20, 4098})
		dir := filepath.Join(root, "step-000000")
		if _, err := Save(context.Background(), dir, stateOf(0, specs, fromMemory), SaveOptions{}); err != nil {
			t.Fatal(err)
		}
		return dir, specs
	}()
	for _, seed := range seeds {
		rng := rand.New(rand.NewPCG(seed, 0x5eed))
		mode := "sync"
		if seed%2 == 0 {
			mode = "async"
		}
		// Every third seed is killed inside the commit: after the
		// temporary directory is complete, before or after the rename.
		stage := ""
		if seed%3 == 0 {
			stage = []string{"before-rename", "after-rename"}[seed/3%2]
		}
		name := fmt.Sprintf("step-%06d", seed)
		before, err := Latest(root)
		if err != nil {
			t.Fatal(err)
		}
		delay := time.Duration(rng.Int64N(int64(1800 * time.Millisecond)))
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), crashHelperEnv+"="+strings.Join([]string{root, name, strconv.FormatUint(seed, 10), mode}, "|"),
			crashStageEnv+"="+stage)
		out, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		var stderr strings.Builder
		cmd.Stderr = &stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		lines := make(chan string, 8)
		go func() {
			sc := bufio.NewScanner(out)
			for sc.Scan() {
				lines <- sc.Text()
			}
			close(lines)
		}()
		if l := <-lines; l != "START" {
			cmd.Process.Kill()
			cmd.Wait()
			t.Fatalf("seed %d: helper said %q, stderr %s", seed, l, stderr.String())
		}
		var said []string
		if stage != "" {
			for l := range lines {
				said = append(said, l)
				if l == stage {
					break
				}
			}
			delay = time.Duration(rng.Int64N(int64(150 * time.Millisecond)))
		}
		time.Sleep(delay)
		cmd.Process.Kill() // SIGKILL
		for l := range lines {
			said = append(said, l)
		}
		cmd.Wait()
		when := "START"
		if stage != "" {
			when = stage
		}
		t.Logf("seed %d (%s save): SIGKILL %v after %s; helper had printed %v", seed, mode, delay, when, said)

		newDir := filepath.Join(root, name)
		latest, err := Latest(root)
		if err != nil {
			t.Fatalf("seed %d: Latest: %v\n%s", seed, err, tree(root))
		}
		switch latest {
		case before:
			if stage == "after-rename" {
				t.Fatalf("seed %d: killed after the rename, yet Latest = %s", seed, latest)
			}
		case newDir:
			if stage == "before-rename" {
				t.Fatalf("seed %d: killed before the rename, yet Latest = %s", seed, latest)
			}
			t.Logf("seed %d: the save had committed before the kill", seed)
		default:
			t.Fatalf("seed %d: Latest = %s, want %s or %s\n%s", seed, latest, before, newDir, tree(root))
		}
		if rep, err := Verify(context.Background(), latest); err != nil {
			t.Fatalf("seed %d: the latest checkpoint %s does not verify: %v (%+v)", seed, latest, err, rep.Problems)
		}
		if _, err := Verify(context.Background(), oldDir); err != nil {
			t.Fatalf("seed %d: the old checkpoint does not verify: %v", seed, err)
		}
		checkReadBack(t, oldDir, 0, oldSpecs)
		// Nothing else loads as a committed checkpoint: every directory
		// that opens also verifies; temporary ones do not open.
		entries, _ := os.ReadDir(root)
		for _, e := range entries {
			if !e.IsDir() {
				continue
			}
			p := filepath.Join(root, e.Name())
			r, err := Open(p)
			if strings.HasPrefix(e.Name(), ".") {
				if err == nil {
					r.Close()
					t.Fatalf("seed %d: temporary directory %s opens as a checkpoint", seed, e.Name())
				}
				continue
			}
			if err != nil {
				t.Fatalf("seed %d: %s does not open: %v", seed, e.Name(), err)
			}
			r.Close()
			if _, err := Verify(context.Background(), p); err != nil {
				t.Fatalf("seed %d: %s opens but does not verify: %v", seed, e.Name(), err)
			}
		}
	}
	// The next save removes what the killed writers left.
	if _, err := Save(context.Background(), filepath.Join(root, "step-999999"), stateOf(999999, oldSpecs, fromMemory), SaveOptions{}); err != nil {
		t.Fatal(err)
	}
	if l, _ := Latest(root); l != filepath.Join(root, "step-999999") {
		t.Fatalf("Latest = %s", l)
	}
	assertNoTemp(t, root)
}

// A save never removes the temporary directory of a writer that is alive.
func TestLiveWriterNotCleaned(t *testing.T) {
	rng := rand.New(rand.NewPCG(31, 31))
	root := t.TempDir()
	g := newGate()
	defer g.release()
	slow := testEngine(t, g)
	specs := makeSpecs(rng, []string{"p.safetensors"}, []int{2 << 20})
	s := NewSaver(SaverOptions{})
	defer s.Close()
	h, err := s.SaveAsync(context.Background(), filepath.Join(root, "step-000001"), stateOf(1, specs, fromMemory), SaveOptions{Engine: slow})
	if err != nil {
		t.Fatal(err)
	}
	live, _ := filepath.Glob(filepath.Join(root, tmpPrefix+"step-000001-*"))
	if len(live) != 2 { // the directory and its lock
		t.Fatalf("temporary entries %v", live)
	}
	// A stale one from a writer process killed mid-save.
	stale, _ := startWriterHelper(t, root, "step-000000", true)
	// Another writer saves (and cleans) meanwhile, with KeepLast 1.
	if _, err := Save(context.Background(), filepath.Join(root, "step-000002"), stateOf(2, specs, fromMemory), SaveOptions{KeepLast: 1}); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(stale); !os.IsNotExist(err) {
		t.Fatal("the stale temporary directory was not removed")
	}
	for _, p := range live {
		if _, err := os.Stat(p); err != nil {
			t.Fatalf("the live writer's %s was removed", p)
		}
	}
	g.release()
	if _, err := h.Wait(); err != nil {
		t.Fatal(err)
	}
	checkReadBack(t, filepath.Join(root, "step-000001"), 0, specs)
	assertNoTemp(t, root)
}

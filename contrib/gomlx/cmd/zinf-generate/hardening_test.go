package main

import (
	"bufio"
	"bytes"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/zinfio/zinf/contrib/gomlx/generate"
)

// runMainWatched runs the command as main does and returns its exit status
// and output; a run still going after limit fails the test (a FIFO opened
// for reading is then opened for writing, which releases it).
func runMainWatched(t *testing.T, fifo string, limit time.Duration, args ...string) (int, string) {
	t.Helper()
	var out bytes.Buffer
	done := make(chan int, 1)
	go func() {
		var o bytes.Buffer
		code := runMain(append([]string{"--dir", t.TempDir()}, args...), &o, &o)
		out = o
		done <- code
	}()
	select {
	case code := <-done:
		return code, out.String()
	case <-time.After(limit):
		if fifo != "" {
			if f, err := os.OpenFile(fifo, os.O_WRONLY|syscall.O_NONBLOCK, 0); err == nil {
				f.Close()
			}
		}
		t.Fatalf("%q still running after %v (blocked opening a file?)", args, limit)
		return 0, ""
	}
}

// TestNonRegularFilesRefused: a named pipe (or a device, or a directory)
// given to a path flag is refused at once with exit status 1, naming the
// flag and the kind of file; opening a FIFO blocked before, until a
// writer came (SIGINT and SIGTERM changed nothing).
func TestNonRegularFilesRefused(t *testing.T) {
	dir := t.TempDir()
	fifo := filepath.Join(dir, "fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Skipf("mkfifo: %v", err)
	}
	// A checkpoint directory whose checkpoint.json is a FIFO, and one
	// whose model.json is.
	ck1 := filepath.Join(dir, "ck1")
	ck2 := filepath.Join(dir, "ck2")
	for _, p := range []string{filepath.Join(ck1, "checkpoint.json"), filepath.Join(ck2, "model.json")} {
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := syscall.Mkfifo(p, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	m := "--model=vocab=256,dim=32,layers=2,heads=4,kv-heads=2,ffn=64"
	for _, c := range []struct {
		fifo string
		args []string
		want []string
	}{
		{fifo, []string{m, "--prompt", "x", "--safetensors", fifo, "--names", "vars"}, []string{"--safetensors", "named pipe (FIFO)"}},
		{fifo, []string{m, "--prompt", "x", "--safetensors", fifo, "--names", "vars", "--mmap", "plain", "--batch", "1"}, []string{"--safetensors", "named pipe (FIFO)"}},
		{fifo, []string{m, "--prompt", "x", "--safetensors", fifo, "--names", "vars", "--drop-cache"}, []string{"--drop-cache", "named pipe (FIFO)"}},
		{fifo, []string{m, "--prompts-file", fifo}, []string{"--prompts-file", "named pipe (FIFO)"}},
		{fifo, []string{"--prompt", "x", "--model-json", fifo}, []string{"--model-json", "named pipe (FIFO)"}},
		{fifo, []string{m, "--prompt", "x", "--config", fifo}, []string{"--config", "named pipe (FIFO)"}},
		{filepath.Join(ck1, "checkpoint.json"), []string{m, "--prompt", "x", "--checkpoint", ck1}, []string{"--checkpoint", "checkpoint.json is a named pipe (FIFO)"}},
		{filepath.Join(ck2, "model.json"), []string{"--prompt", "x", "--checkpoint", ck2}, []string{"--model-json", "model.json is a named pipe (FIFO)"}},
		{"", []string{m, "--prompts-file", "/dev/zero"}, []string{"--prompts-file", "character device"}},
		{"", []string{"--prompt", "x", "--model-json", dir}, []string{"--model-json", "a directory"}},
	} {
		code, out := runMainWatched(t, c.fifo, 30*time.Second, c.args...)
		if code != 1 {
			t.Errorf("%q: exit status %d, want 1\n%s", c.args, code, out)
		}
		for _, w := range c.want {
			if !strings.Contains(out, w) {
				t.Errorf("%q: output lacks %q:\n%s", c.args, w, out)
			}
		}
	}
}

// TestSamplingNaNRefused: NaN, which every comparison fails, is refused
// for --temperature and --top-p naming the flag (it was taken).
func TestSamplingNaNRefused(t *testing.T) {
	for _, c := range []struct{ flag, want string }{
		{"--temperature", "--temperature NaN (allowed: a finite number > 0)"},
		{"--temperature", "--temperature +Inf (allowed: a finite number > 0)"},
		{"--top-p", "--top-p NaN (allowed: 0 < p <= 1)"},
	} {
		v := "NaN"
		if strings.Contains(c.want, "Inf") {
			v = "+Inf"
		}
		out, err := runCLI(t, "--prompt", "x", "--strategy", "top_p", c.flag, v)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s %s: %v (want %q)\n%s", c.flag, v, err, c.want, out)
		}
	}
}

// TestWeightsOfAnotherModelRefused: a file --make-model wrote for a model
// with biases, given for the same model without them, is refused naming
// the tensors the model does not have and the model asked for (it
// generated, ignoring them, and --verify agreed).
func TestWeightsOfAnotherModelRefused(t *testing.T) {
	path := filepath.Join(t.TempDir(), "m.safetensors")
	spec := "vocab=256,dim=32,layers=2,heads=4,kv-heads=2,ffn=64"
	if out, err := runCLI(t, "--model", spec+",bias=true", "--make-model", path); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	out, err := runCLI(t, "--model", spec+",bias=false", "--safetensors", path, "--names", "vars", "--prompt", "x", "--max-new-tokens", "2", "--verify")
	if err == nil {
		t.Fatalf("generated from another model's weights:\n%s", out)
	}
	for _, want := range []string{"tensors the model does not have", "/biases", "the model asked for", "bias=false"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error lacks %q: %v", want, err)
		}
	}
}

// TestHelperProcess is the command in a child process for the signal
// tests (it runs only when they start it).
func TestHelperProcess(t *testing.T) {
	args := os.Getenv("ZINF_GENERATE_TEST_ARGS")
	if args == "" {
		t.Skip("the signal tests' child process")
	}
	os.Exit(runMain(strings.Split(args, "\x1f"), os.Stdout, os.Stderr))
}

// TestSignalExitStatus: SIGINT while decoding ends the run with status 130
// and "interrupted" (it was 1 and "context canceled"), SIGTERM with 143;
// the run's directory is left as a finished run leaves it (the runtime
// closed, its swap directories removed).
func TestSignalExitStatus(t *testing.T) {
	for _, c := range []struct {
		sig  syscall.Signal
		code int
	}{{syscall.SIGINT, 130}, {syscall.SIGTERM, 143}} {
		dir := t.TempDir()
		args := []string{"--dir", dir, "--model", "vocab=256,dim=32,layers=2,heads=4,kv-heads=2,ffn=64", "--pool", "4MiB", "--prompt", "In the beginning",
			"--max-new-tokens", "20000", "--plan=false", "--batch", "1"}
		cmd := exec.Command(os.Args[0], "-test.run=^TestHelperProcess$")
		cmd.Env = append(os.Environ(), "ZINF_GENERATE_TEST_ARGS="+strings.Join(args, "\x1f"))
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		stdout, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		watchdog := time.AfterFunc(3*time.Minute, func() { cmd.Process.Kill() })
		sc := bufio.NewScanner(stdout)
		decoding := false
		for sc.Scan() {
			if strings.Contains(sc.Text(), " decode ") {
				decoding = true
				break
			}
		}
		if !decoding {
			cmd.Wait()
			t.Fatalf("no decoding step seen; stderr:\n%s", stderr.String())
		}
		sent := time.Now()
		if err := cmd.Process.Signal(c.sig); err != nil {
			t.Fatal(err)
		}
		go io.Copy(io.Discard, stdout)
		err = cmd.Wait()
		watchdog.Stop()
		took := time.Since(sent)
		code := cmd.ProcessState.ExitCode()
		t.Logf("%v: exit status %d after %v", c.sig, code, took)
		if code != c.code || !strings.Contains(stderr.String(), "zinf-generate: interrupted by "+c.sig.String()) {
			t.Errorf("%v: exit status %d (%v), want %d and 'interrupted by %v'; stderr:\n%s", c.sig, code, err, c.code, c.sig, stderr.String())
		}
		// The bandwidth probe's cache stays, as after any run; nothing else.
		des, err := os.ReadDir(dir)
		var left []string
		for _, de := range des {
			if de.Name() != ".zinf-bandwidth.json" {
				left = append(left, de.Name())
			}
		}
		if err != nil || len(left) > 0 {
			t.Errorf("%v: --dir holds %q after the run (%v)", c.sig, left, err)
		}
	}
}

// nanWeights report NaN/Inf counts as the generator's Weights do.
type nanWeights struct{ generate.Weights }

func (nanWeights) NonFinite() map[string]int { return map[string]int{"/b": 2, "/a": 1} }

// TestWarnNonFinite: weights holding NaN or infinite values are warned of
// at load, a line per tensor naming it and the count (they generated
// silently).
func TestWarnNonFinite(t *testing.T) {
	var out bytes.Buffer
	warnNonFinite(nanWeights{}, &out)
	want := "zinf-generate: warning: the weights' \"/a\" hold 1 NaN or infinite values: generation computes with them\n" +
		"zinf-generate: warning: the weights' \"/b\" hold 2 NaN or infinite values: generation computes with them\n"
	if out.String() != want {
		t.Fatalf("warnings:\n%s\nwant:\n%s", out.String(), want)
	}
}

package iobench_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/zinfio/zinf/aio"
	"github.com/zinfio/zinf/cmd/zinf/internal/iobench"
)

const plantSize = 64 << 10

// victim is a file another user's link points at: its bytes must survive.
func victim(t *testing.T) (path string, content []byte) {
	t.Helper()
	path = filepath.Join(t.TempDir(), "root-only")
	content = []byte("precious bytes that zinf must never overwrite\n")
	if err := os.WriteFile(path, content, 0o600); err != nil {
		t.Fatal(err)
	}
	return path, content
}

func wantContent(t *testing.T, path string, content []byte) {
	t.Helper()
	got, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%s: %v (it must still be there)", path, err)
	}
	if !bytes.Equal(got, content) {
		t.Fatalf("%s was changed: %d bytes, want the original %d", path, len(got), len(content))
	}
}

func wantLink(t *testing.T, link, target string) {
	t.Helper()
	got, err := os.Readlink(link)
	if err != nil || got != target {
		t.Fatalf("link %s = %q, %v; want it left pointing at %s", link, got, err, target)
	}
}

func opts(dir, op string) iobench.Options {
	return iobench.Options{Dir: dir, SizeBytes: plantSize, Op: op, Loops: 1,
		Engine: aio.Options{Backend: aio.BackendPosix, BlockSizeBytes: 4096, QueueDepth: 4, Direct: aio.DirectOff}}
}

// TestRunRefusesPlantedSymlink is the regression for a link planted at the
// predictable data file name: neither write nor read, engine nor naive,
// host nor device, may write through it, and the link stays.
func TestRunRefusesPlantedSymlink(t *testing.T) {
	for _, op := range []string{"write", "read"} {
		for _, mode := range []string{"engine", "naive", "gpu"} {
			t.Run(op+"/"+mode, func(t *testing.T) {
				target, content := victim(t)
				dir := t.TempDir()
				link := filepath.Join(dir, fmt.Sprintf("zinf-io-%d.dat", plantSize))
				if err := os.Symlink(target, link); err != nil {
					t.Fatal(err)
				}
				o := opts(dir, op)
				var err error
				switch mode {
				case "engine":
					_, err = iobench.Run(t.Context(), o)
				case "naive":
					o.Naive = true
					_, err = iobench.Run(t.Context(), o)
				case "gpu":
					_, err = iobench.RunGPU(t.Context(), iobench.GPUOptions{Options: o, Device: iobench.DeviceSim})
				}
				if err == nil || !strings.Contains(err.Error(), link) || !strings.Contains(err.Error(), "symbolic link") {
					t.Fatalf("err = %v, want a refusal naming the link %s", err, link)
				}
				wantContent(t, target, content)
				wantLink(t, link, target)
			})
		}
	}
}

// TestRunLeavesExistingFile: a regular file already at the data file name
// is never written or removed; a large enough one is reused for reads.
func TestRunLeavesExistingFile(t *testing.T) {
	dir := t.TempDir()
	name := filepath.Join(dir, fmt.Sprintf("zinf-io-%d.dat", plantSize))
	big := bytes.Repeat([]byte{0xa5}, plantSize)
	if err := os.WriteFile(name, big, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, naive := range []bool{false, true} {
		o := opts(dir, "write")
		o.Naive = naive
		_, err := iobench.Run(t.Context(), o)
		if err == nil || !strings.Contains(err.Error(), "will not overwrite") {
			t.Fatalf("write (naive %v) over an existing file: %v, want a refusal", naive, err)
		}
		wantContent(t, name, big)
		o.Op = "read"
		if _, err := iobench.Run(t.Context(), o); err != nil {
			t.Fatalf("read (naive %v) of an existing file of the right size: %v", naive, err)
		}
		wantContent(t, name, big)
	}
	if _, err := iobench.RunGPU(t.Context(), iobench.GPUOptions{Options: opts(dir, "read"), Device: iobench.DeviceSim, Verify: true}); err != nil {
		t.Fatalf("device read of an existing file: %v", err)
	}
	wantContent(t, name, big)

	// Too small to read --size from: zinf would have to fill it. Refused.
	small := []byte("short")
	if err := os.WriteFile(name, small, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := iobench.Run(t.Context(), opts(dir, "read")); err == nil || !strings.Contains(err.Error(), "fewer than --size") {
		t.Fatalf("read of a too-small existing file: %v, want a refusal", err)
	}
	wantContent(t, name, small)
}

// TestRunCreatesAndRemovesItsOwnFile: the ordinary case still works, and
// --keep leaves a file that a second write then refuses to overwrite.
func TestRunCreatesAndRemovesItsOwnFile(t *testing.T) {
	dir := t.TempDir()
	if _, err := iobench.Run(t.Context(), opts(dir, "write")); err != nil {
		t.Fatal(err)
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 0 {
		t.Fatalf("a run without --keep left %v", ents)
	}
	o := opts(dir, "write")
	o.Keep = true
	if _, err := iobench.Run(t.Context(), o); err != nil {
		t.Fatal(err)
	}
	o.Op = "read"
	if _, err := iobench.Run(t.Context(), o); err != nil {
		t.Fatalf("reading the kept file: %v", err)
	}
	o.Op = "write"
	if _, err := iobench.Run(t.Context(), o); err == nil || !strings.Contains(err.Error(), "will not overwrite") {
		t.Fatalf("rewriting a file kept by an earlier run: %v, want a refusal", err)
	}
}

// TestTuneLeavesPlantedNames: tune works in a private directory of its own
// and leaves every name it finds in --path as it was.
func TestTuneLeavesPlantedNames(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	target, content := victim(t)
	dir := t.TempDir()
	link := filepath.Join(dir, fmt.Sprintf("zinf-tune-%d.dat", os.Getpid()))
	if err := os.Symlink(target, link); err != nil {
		t.Fatal(err)
	}
	plain := filepath.Join(dir, "zinf-tune.dat")
	if err := os.WriteFile(plain, content, 0o644); err != nil {
		t.Fatal(err)
	}
	_, err := iobench.Tune(ctx, iobench.TuneOptions{Dir: dir, SizeBytes: plantSize, Loops: 1, Backends: []string{aio.BackendPosix},
		BlockSizes: []int{4096}, Depths: []int{2}, Parallel: []int{1}, Direct: aio.DirectOff})
	if err != nil {
		t.Fatal(err)
	}
	wantContent(t, target, content)
	wantLink(t, link, target)
	wantContent(t, plain, content)
	ents, _ := os.ReadDir(dir)
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	want := []string{filepath.Base(plain), filepath.Base(link)}
	slices.Sort(want)
	if !slices.Equal(names, want) {
		t.Fatalf("--path holds %v after tune, want only %v", names, want)
	}
}

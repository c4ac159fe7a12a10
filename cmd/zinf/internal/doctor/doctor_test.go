package doctor

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/zinfio/zinf/aio"
)

func find(t *testing.T, r *Report, name string) Check {
	t.Helper()
	for _, c := range r.Checks {
		if c.Name == name {
			return c
		}
	}
	t.Fatalf("no check named %q in %+v", name, r.Checks)
	return Check{}
}

func TestRun(t *testing.T) {
	good := t.TempDir()
	missing := filepath.Join(t.TempDir(), "nonexistent")
	file := filepath.Join(t.TempDir(), "a-file")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	r := Run([]string{good, missing, file})

	sys := find(t, r, "system")
	if !sys.OK || !strings.Contains(sys.Detail, fmt.Sprintf("%d CPUs", runtime.NumCPU())) || !strings.Contains(sys.Detail, runtime.Version()) {
		t.Errorf("system check %+v: want the CPU count and Go version", sys)
	}
	for _, b := range aio.Backends {
		c := find(t, r, "backend "+b)
		if avail := aio.Available(b) == nil; c.OK != avail {
			t.Errorf("backend %s reported ok=%v, aio.Available says %v", b, c.OK, avail)
		}
		if !c.OK && c.Detail == "" {
			t.Errorf("backend %s unavailable without a reason", b)
		}
	}
	if !find(t, r, "backend posix").OK {
		t.Error("posix must always be available")
	}
	if m := find(t, r, "memlock"); !strings.Contains(m.Detail, "limit") && !strings.Contains(m.Detail, "unlimited") {
		t.Errorf("memlock check %+v says nothing about the limit", m)
	}
	if m := find(t, r, "memory"); !m.OK || !strings.Contains(m.Detail, "may still be allocated") || !strings.Contains(m.Detail, "MemAvailable") {
		t.Errorf("memory check %+v: want what may be allocated and MemAvailable", m)
	}
	// Registered buffers: where io_uring works, the check registered test
	// memory and says how it went; as root (CAP_IPC_LOCK) it succeeds.
	reg := find(t, r, "registered")
	switch {
	case aio.Available(aio.BackendUring) != nil:
		if reg.OK {
			t.Errorf("registered buffers reported working without io_uring: %+v", reg)
		}
	case os.Geteuid() == 0 && !reg.OK:
		t.Errorf("registered buffers refused to root: %+v", reg)
	case !reg.OK && !strings.Contains(reg.Detail, "refused"):
		t.Errorf("registered buffers not OK without a reason: %+v", reg)
	}

	align, direct, err := aio.ProbeDir(good, aio.DirectOptional)
	if err != nil {
		t.Fatal(err)
	}
	g := find(t, r, "path "+good)
	if direct {
		if !g.OK || !strings.Contains(g.Detail, "O_DIRECT yes") || !strings.Contains(g.Detail, fmt.Sprintf("alignment %d bytes", align)) || !strings.Contains(g.Detail, "free") {
			t.Errorf("good path %+v: want O_DIRECT yes, alignment %d and free space", g, align)
		}
	} else if g.OK || !strings.Contains(g.Detail, "O_DIRECT no") {
		t.Errorf("path without O_DIRECT %+v", g)
	}
	if m := find(t, r, "path "+missing); m.OK || !strings.Contains(m.Detail, "no such file") {
		t.Errorf("missing path %+v: want a failure saying it does not exist", m)
	}
	if f := find(t, r, "path "+file); f.OK || !strings.Contains(f.Detail, "not a directory") {
		t.Errorf("file path %+v: want a failure saying it is not a directory", f)
	}
	if ents, _ := os.ReadDir(good); len(ents) != 0 {
		t.Errorf("the probe left %v in %s", ents, good)
	}

	// The GPU side: on a machine without one (or without cuFile), an
	// explained failure; never a silent pass.
	for _, name := range []string{"cuda", "cufile"} {
		c := find(t, r, name)
		if c.OK {
			t.Logf("%s available here: %s", name, c.Detail)
			continue
		}
		if len(c.Detail) < 20 {
			t.Errorf("%s unavailable without a useful reason: %q", name, c.Detail)
		}
	}
}

func TestReadOnlyPath(t *testing.T) {
	dir := t.TempDir()
	if err := unix.Mount("tmpfs", dir, "tmpfs", unix.MS_RDONLY, ""); err != nil {
		t.Skipf("cannot mount a read-only tmpfs here (needs root / CAP_SYS_ADMIN): %v", err)
	}
	t.Cleanup(func() { unix.Unmount(dir, 0) })
	c := find(t, Run([]string{dir}), "path "+dir)
	if c.OK || !strings.Contains(c.Detail, "not writable") {
		t.Fatalf("read-only path %+v: want a failure saying it is not writable", c)
	}
}

func TestWriteAndJSON(t *testing.T) {
	r := &Report{}
	r.add("first", true, "fine %d", 1)
	r.add("second", false, "  broken: %s  ", "why")
	var out bytes.Buffer
	if err := r.Write(&out); err != nil {
		t.Fatal(err)
	}
	want := "ok   first            fine 1\nno   second           broken: why\n"
	if out.String() != want {
		t.Fatalf("Write:\n%q\nwant\n%q", out.String(), want)
	}
	data, err := json.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	if got := string(data); got != `{"checks":[{"name":"first","ok":true,"detail":"fine 1"},{"name":"second","ok":false,"detail":"  broken: why  "}]}` {
		t.Fatalf("JSON: %s", got)
	}
}

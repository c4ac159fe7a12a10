package main

import (
	"encoding/json"
	"fmt"
	"runtime"
	"slices"
	"strings"
	"testing"

	"github.com/zinfio/zinf/aio"
)

type doctorCheck struct {
	Name   string `json:"name"`
	OK     bool   `json:"ok"`
	Detail string `json:"detail"`
}

func TestDoctorJSON(t *testing.T) {
	dir := t.TempDir()
	code, out, errs := runCLI(t, "doctor", "--path", dir, "--path", "/nonexistent", "--json")
	if code == 0 || !strings.Contains(errs, "unusable swap path(s): /nonexistent") {
		t.Fatalf("an unusable path must make the exit code non-zero, naming it: exit %d:\n%s", code, errs)
	}
	if code, _, errs := runCLI(t, "doctor", "--path", dir, "--json"); code != 0 {
		t.Fatalf("usable path: exit %d:\n%s", code, errs)
	}
	var rep struct {
		Checks []doctorCheck `json:"checks"`
	}
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("not JSON: %v\n%s", err, out)
	}
	byName := map[string]doctorCheck{}
	for _, c := range rep.Checks {
		byName[c.Name] = c
	}
	get := func(name string) doctorCheck {
		t.Helper()
		c, ok := byName[name]
		if !ok {
			t.Fatalf("no %q check in %s", name, out)
		}
		return c
	}

	for _, b := range []string{"uring", "libaio", "posix"} {
		c := get("backend " + b)
		if c.OK != (aio.Available(b) == nil) || (!c.OK && c.Detail == "") {
			t.Errorf("backend %s: %+v", b, c)
		}
	}
	align, direct, err := aio.ProbeDir(dir, aio.DirectOptional)
	if err != nil {
		t.Fatal(err)
	}
	p := get("path " + dir)
	if direct && (!p.OK || !strings.Contains(p.Detail, "O_DIRECT yes") || !strings.Contains(p.Detail, fmt.Sprintf("alignment %d bytes", align))) {
		t.Errorf("path %s: %+v, want O_DIRECT yes, alignment %d", dir, p, align)
	}
	if !direct && !strings.Contains(p.Detail, "O_DIRECT no") {
		t.Errorf("path %s without O_DIRECT: %+v", dir, p)
	}
	if m := get("path /nonexistent"); m.OK || !strings.Contains(m.Detail, "no such file or directory") {
		t.Errorf("missing path: %+v, want a clear failure", m)
	}
	if m := get("memlock"); m.Detail == "" {
		t.Errorf("memlock: %+v", m)
	}
	if s := get("system"); !strings.Contains(s.Detail, fmt.Sprintf("%d CPUs", runtime.NumCPU())) {
		t.Errorf("system: %+v, want the CPU count", s)
	}
	for _, name := range []string{"cuda", "cufile"} {
		c := get(name)
		if c.OK {
			t.Logf("%s available on this machine: %s", name, c.Detail)
			continue
		}
		if len(c.Detail) < 20 {
			t.Errorf("%s unavailable without a reason: %+v", name, c)
		}
	}
	if got := tree(t, dir); !slices.Equal(got, []string{"."}) {
		t.Fatalf("doctor left %v in the path it probed", got)
	}
}

func TestDoctorText(t *testing.T) {
	dir := t.TempDir()
	code, out, errs := runCLI(t, "doctor", "--path", dir, "--path", "/nonexistent")
	if code != 1 {
		t.Fatalf("exit %d, want 1 for an unusable path:\n%s", code, errs)
	}
	wantAll(t, "report", out, "backend posix", "memlock", "path "+dir, "no   path /nonexistent", "cuda", "cufile")
	if code, _, errs := runCLI(t, "doctor", "stray"); code == 0 || !strings.Contains(errs, "unexpected arguments") {
		t.Fatalf("stray argument: exit %d:\n%s", code, errs)
	}
}

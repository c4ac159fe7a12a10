package gds_test

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/zinfio/zinf/accel"
	"github.com/zinfio/zinf/aio"
	"github.com/zinfio/zinf/gds"
)

func selectOptions(env *bounceEnv, logs *logCapture) gds.SelectOptions {
	return gds.SelectOptions{AIO: env.eng, Pool: env.pool, Logger: slog.New(logs)}
}

func TestSelectOffAndSim(t *testing.T) {
	env := newBounceEnv(t, accel.SimOptions{}, aio.Options{})
	logs := &logCapture{}
	io, err := gds.Select("off", env.sim, selectOptions(env, logs))
	if err != nil {
		t.Fatal(err)
	}
	if io.Mode() != gds.NameBounce {
		t.Fatalf("off chose %q", io.Mode())
	}
	io.Close()
	if w := logs.warnings(); len(w) != 0 {
		t.Errorf("off warned: %q", w)
	}

	// auto on a simulated device: the bounce path, with exactly one warning
	// saying why.
	io, err = gds.Select("auto", env.sim, selectOptions(env, logs))
	if err != nil {
		t.Fatal(err)
	}
	defer io.Close()
	if io.Mode() != gds.NameBounce {
		t.Fatalf("auto on sim chose %q", io.Mode())
	}
	w := logs.warnings()
	if len(w) != 1 || !strings.Contains(w[0], "bounce path") || !strings.Contains(w[0], "device sim is not a CUDA device") {
		t.Errorf("warnings %q, want one naming the bounce path and the reason", w)
	}

	// required on a simulated device fails with the reason.
	_, err = gds.Select("required", env.sim, selectOptions(env, logs))
	wantErr(t, err, gds.ErrUnavailable, `mode "required"`, "not a CUDA device")

	_, err = gds.Select("maybe", env.sim, selectOptions(env, logs))
	wantErr(t, err, nil, `mode "maybe" is unknown`)
}

func TestSelectWithCUDA(t *testing.T) {
	s := newStandins(t)
	env := newBounceEnv(t, accel.SimOptions{}, aio.Options{})
	logs := &logCapture{}
	opts := selectOptions(env, logs)
	opts.GDS.Library = s.cufileLib

	io, err := gds.Select("auto", s.dev, opts)
	if err != nil {
		t.Fatal(err)
	}
	if io.Mode() != gds.NameGDS {
		t.Fatalf("auto with a working cuFile chose %q", io.Mode())
	}
	// The chosen path works end to end.
	path := filepath.Join(t.TempDir(), "f")
	f, err := io.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	want := randomBytes(9, 100000)
	m := upload(t, s.dev, want, 0, 100000)
	if _, err := io.WriteFromDevice(context.Background(), f, m, 0, 0, 100000); err != nil {
		t.Fatal(err)
	}
	sameBytes(t, "file", fileBytes(t, path, 0, 100000), want)
	if err := io.Close(); err != nil {
		t.Fatal(err)
	}
	if st := s.cufile(t); st["handles"] != 0 || st["driver"] != 0 {
		t.Fatalf("after Close: %v", st)
	}

	io, err = gds.Select("required", s.dev, opts)
	if err != nil {
		t.Fatal(err)
	}
	io.Close()

	// Without cuFile, auto falls back to the bounce path over the CUDA
	// device and says why; required fails.
	opts.GDS.Library = filepath.Join(t.TempDir(), "libcufile.so.0")
	io, err = gds.Select("auto", s.dev, opts)
	if err != nil {
		t.Fatal(err)
	}
	defer io.Close()
	if io.Mode() != gds.NameBounce {
		t.Fatalf("auto without cuFile chose %q", io.Mode())
	}
	if w := logs.warnings(); len(w) != 1 || !strings.Contains(w[0], "libcufile.so.0") {
		t.Errorf("warnings %q", w)
	}
	_, err = gds.Select("required", s.dev, opts)
	wantErr(t, err, gds.ErrUnavailable, "libcufile.so.0")

	// The bounce path over the (stand-in) CUDA device moves bytes too.
	g, err := io.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	back, _ := s.dev.Alloc(100000)
	if _, err := io.ReadToDevice(context.Background(), g, back, 0, 0, 100000); err != nil {
		t.Fatal(err)
	}
	sameBytes(t, "device", download(t, s.dev, back, 0, 100000), want)
}

func TestSelectBounceNeedsEngineAndPool(t *testing.T) {
	env := newBounceEnv(t, accel.SimOptions{}, aio.Options{})
	_, err := gds.Select("off", env.sim, gds.SelectOptions{})
	wantErr(t, err, accel.ErrInvalid, "aio engine", "buffers pool")
}

// A cuFile whose driver opens but which refuses to register the files of
// a disk (CU_FILE_HANDLE_NOT_REGISTERED, as on a virtio disk without udev
// properties): auto checks a file on each path before choosing GDS, so it
// takes the bounce path with one warning naming the path and cuFile's
// code, instead of failing the first swap-in; required fails the same
// way; the check leaves nothing in the directory. With registration
// working, auto chooses GDS and leaves nothing behind either.
func TestSelectChecksFileRegistration(t *testing.T) {
	s := newStandins(t)
	env := newBounceEnv(t, accel.SimOptions{}, aio.Options{})
	logs := &logCapture{}
	opts := selectOptions(env, logs)
	opts.GDS.Library = s.cufileLib
	dir := t.TempDir()
	opts.GDS.Paths = []string{dir}
	empty := func() {
		t.Helper()
		if ents, err := os.ReadDir(dir); err != nil || len(ents) != 0 {
			t.Fatalf("%s after the check: %v %v", dir, ents, err)
		}
	}

	io, err := gds.Select("auto", s.dev, opts)
	if err != nil {
		t.Fatal(err)
	}
	if io.Mode() != gds.NameGDS {
		t.Fatalf("auto with registration working chose %q", io.Mode())
	}
	io.Close()
	empty()
	if w := logs.warnings(); len(w) != 0 {
		t.Errorf("warnings %q", w)
	}

	t.Setenv("STANDIN_FAIL", "cuFileHandleRegister:5027")
	io, err = gds.Select("auto", s.dev, opts)
	if err != nil {
		t.Fatal(err)
	}
	defer io.Close()
	if io.Mode() != gds.NameBounce {
		t.Fatalf("auto with every registration refused chose %q", io.Mode())
	}
	if w := logs.warnings(); len(w) != 1 || !strings.Contains(w[0], "does not register a file in "+dir) || !strings.Contains(w[0], "5027") {
		t.Errorf("warnings %q, want one naming %s and the code", w, dir)
	}
	empty()
	_, err = gds.Select("required", s.dev, opts)
	wantErr(t, err, gds.ErrUnavailable, `mode "required"`, "does not register a file in "+dir, "5027")
	empty()
	if st := s.cufile(t); st["handles"] != 0 || st["driver"] != 0 {
		t.Fatalf("after the refused checks: %v", st)
	}
	// The bounce path chosen instead works on the same directory.
	f, err := io.OpenFile(filepath.Join(dir, "f"), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	want := randomBytes(3, 8192)
	m := upload(t, s.dev, want, 0, 8192)
	if _, err := io.WriteFromDevice(context.Background(), f, m, 0, 0, 8192); err != nil {
		t.Fatal(err)
	}
	sameBytes(t, "file", fileBytes(t, filepath.Join(dir, "f"), 0, 8192), want)
}

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

package backendinfo_test

import (
	"bytes"
	"log/slog"
	"runtime"
	"strings"
	"testing"

	"github.com/gomlx/compute"
	_ "github.com/gomlx/compute/gobackend"
	"golang.org/x/sys/cpu"

	"github.com/zinfio/zinf/contrib/gomlx/internal/backendinfo"
)

func TestPortableNoteMatchesBuild(t *testing.T) {
	backend, err := compute.NewWithConfig("go:ops_sequential")
	if err != nil {
		t.Fatal(err)
	}
	defer backend.Finalize()
	msg, ok := backendinfo.PortableNote(backend)
	if backendinfo.SIMD() && ok {
		t.Fatalf("SIMD build warned: %s", msg)
	}
	if !backendinfo.SIMD() && runtime.GOARCH == "amd64" && cpu.X86.HasAVX2 && !ok {
		t.Fatal("a portable build on an AVX2 CPU did not warn")
	}
	if ok && !strings.Contains(msg, "GOEXPERIMENT=simd") {
		t.Fatalf("the warning does not say how to rebuild: %s", msg)
	}
	if want := map[bool]string{true: "simd", false: "portable"}[backendinfo.SIMD()]; backendinfo.Build() != want {
		t.Fatalf("Build() = %q, want %q", backendinfo.Build(), want)
	}
	// Once per process, however many runtimes are opened.
	var buf bytes.Buffer
	log := slog.New(slog.NewTextHandler(&buf, nil))
	backendinfo.WarnPortable(log, backend)
	backendinfo.WarnPortable(log, backend)
	if n := strings.Count(buf.String(), "portable matmul loops"); ok && n != 1 || !ok && n != 0 {
		t.Fatalf("warned %d times (applies: %v): %s", n, ok, buf.String())
	}
	if _, ok := backendinfo.PortableNote(nil); ok {
		t.Fatal("a nil backend warned")
	}
}

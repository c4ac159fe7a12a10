//go:build !cgo

package cuda_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/zinfio/zinf/accel"
	"github.com/zinfio/zinf/accel/cuda"
)

// TestNoCgoBuild checks what a build without cgo says: every entry point
// fails with ErrUnavailable and names the reason.
func TestNoCgoBuild(t *testing.T) {
	_, err := cuda.Open(cuda.Options{})
	if !errors.Is(err, accel.ErrUnavailable) || !strings.Contains(err.Error(), "built without cgo") {
		t.Fatalf("Open: %v", err)
	}
	_, err = cuda.Probe(cuda.Options{Ordinal: 1})
	if !errors.Is(err, accel.ErrUnavailable) || !strings.Contains(err.Error(), "built without cgo") {
		t.Fatalf("Probe: %v", err)
	}
}

package cuda

import (
	"errors"
	"strings"
	"testing"

	"github.com/zinfio/zinf/accel"
)

func TestErrorNamesAndSentinels(t *testing.T) {
	cases := []struct {
		code        int
		name        string
		oom, unavai bool
	}{
		{resultOutOfMemory, "CUDA_ERROR_OUT_OF_MEMORY", true, false},
		{resultNoDevice, "CUDA_ERROR_NO_DEVICE", false, true},
		{resultStubLibrary, "CUDA_ERROR_STUB_LIBRARY", false, true},
		{resultSystemDriverMismatch, "CUDA_ERROR_SYSTEM_DRIVER_MISMATCH", false, true},
		{resultInvalidValue, "CUDA_ERROR_INVALID_VALUE", false, false},
		{4242, "CUresult(4242)", false, false},
	}
	for _, c := range cases {
		e := newError("cuTest", c.code, "", "")
		if e.Name != c.name {
			t.Errorf("code %d named %q, want %q", c.code, e.Name, c.name)
		}
		if errors.Is(e, accel.ErrOutOfMemory) != c.oom || errors.Is(e, accel.ErrUnavailable) != c.unavai {
			t.Errorf("code %d: Is(ErrOutOfMemory)=%v Is(ErrUnavailable)=%v", c.code,
				errors.Is(e, accel.ErrOutOfMemory), errors.Is(e, accel.ErrUnavailable))
		}
	}
	// The driver's own name wins over the table.
	e := newError("cuMemAlloc_v2", 2, "DRIVER_NAME", "driver text")
	if got := e.Error(); got != "cuda: cuMemAlloc_v2 failed: DRIVER_NAME (2): driver text" {
		t.Errorf("message %q", got)
	}
}

func TestNoCgoMessage(t *testing.T) {
	if !errors.Is(errNoCgo, accel.ErrUnavailable) {
		t.Fatal("errNoCgo does not match accel.ErrUnavailable")
	}
	for _, s := range []string{"built without cgo", "CGO_ENABLED=1", "libcuda.so.1"} {
		if !strings.Contains(errNoCgo.Error(), s) {
			t.Errorf("%q does not say %q", errNoCgo, s)
		}
	}
}

func TestUnavailableWrapsOnce(t *testing.T) {
	err := unavailable(errors.New("x"))
	if !errors.Is(err, accel.ErrUnavailable) {
		t.Fatal("not unavailable")
	}
	if again := unavailable(err); again != err {
		t.Errorf("wrapped twice: %v", again)
	}
}

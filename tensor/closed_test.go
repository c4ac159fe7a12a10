package tensor_test

import (
	"errors"
	"fmt"
	"testing"

	"github.com/zinfio/zinf/tensor"
)

func TestClosedError(t *testing.T) {
	a, b := tensor.ClosedError("a: closed"), tensor.ClosedError("b: closed")
	wrapped := fmt.Errorf("op on x: %w", a)
	switch {
	case !errors.Is(wrapped, tensor.ErrClosed):
		t.Error("a package's sentinel does not match tensor.ErrClosed")
	case !errors.Is(wrapped, a):
		t.Error("a package's sentinel does not match itself")
	case errors.Is(wrapped, b):
		t.Error("one package's sentinel matches another's")
	case errors.Is(errors.New("closed"), tensor.ErrClosed):
		t.Error("any error matches")
	case a.Error() != "a: closed":
		t.Errorf("message %q", a.Error())
	}
}

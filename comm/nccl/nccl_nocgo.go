//go:build !cgo

package nccl

import (
	"fmt"

	"github.com/zinfio/zinf/accel"
)

// load fails: loading a C library at run time needs cgo.
func load(path string) (library, error) {
	return nil, fmt.Errorf("nccl: zinf was built without cgo (CGO_ENABLED=0), so it cannot load %s; rebuild with CGO_ENABLED=1: %w", path, accel.ErrUnavailable)
}

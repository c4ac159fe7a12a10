//go:build !linux

package zinf

import (
	"fmt"
	"os"
)

// lockRoot checks that the checkpoint root is a directory. Elsewhere than
// Linux the root is not locked (as checkpoint's own locks are not): do not
// point two jobs at one root.
func lockRoot(root string) (*os.File, error) {
	fi, err := os.Stat(root)
	if err != nil {
		return nil, fmt.Errorf("zinf: checkpointer: opening the checkpoint root: %w", err)
	}
	if !fi.IsDir() {
		return nil, fmt.Errorf("zinf: checkpointer: the checkpoint root %s is not a directory", root)
	}
	return nil, nil
}

package zinf

import (
	"errors"
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// lockRoot opens the checkpoint root and takes an exclusive flock on the
// directory itself: no file is created in the user's directory, and the
// kernel drops the lock when the process dies, SIGKILL included.
func lockRoot(root string) (*os.File, error) {
	f, err := os.Open(root)
	if err != nil {
		return nil, fmt.Errorf("zinf: checkpointer: opening the checkpoint root: %w", err)
	}
	if fi, err := f.Stat(); err != nil || !fi.IsDir() {
		f.Close()
		return nil, fmt.Errorf("zinf: checkpointer: the checkpoint root %s is not a directory", root)
	}
	for {
		err = unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
		if !errors.Is(err, unix.EINTR) {
			break
		}
	}
	if errors.Is(err, unix.EWOULDBLOCK) {
		f.Close()
		return nil, fmt.Errorf("zinf: checkpointer: the checkpoint root %s is in use by another checkpointer (another training job saving there holds its lock)", root)
	}
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("zinf: checkpointer: locking the checkpoint root %s: %w", root, err)
	}
	return f, nil
}

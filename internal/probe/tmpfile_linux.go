package probe

import "golang.org/x/sys/unix"

// tmpfileFlag opens an unnamed file in a directory (O_TMPFILE): it has no
// name to leave behind when the process is killed during a probe.
const tmpfileFlag = unix.O_TMPFILE

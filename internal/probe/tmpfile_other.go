//go:build !linux

package probe

// tmpfileFlag is 0 where there is no O_TMPFILE: the probe uses a named
// file, removed when it ends.
const tmpfileFlag = 0

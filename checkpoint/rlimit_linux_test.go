//go:build linux

package checkpoint

import (
	"bufio"
	"fmt"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// limitAddressSpace caps this process's address space at its current size
// plus extra bytes, so that any allocation beyond that fails (the Go
// runtime then dies with "out of memory") instead of taking the machine's
// memory. Relative to the current size because the race detector maps
// terabytes of shadow address space up front.
func limitAddressSpace(extra uint64) error {
	f, err := os.Open("/proc/self/status")
	if err != nil {
		return err
	}
	defer f.Close()
	var vmKiB uint64
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "VmSize:"); ok {
			vmKiB, err = strconv.ParseUint(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			if err != nil {
				return fmt.Errorf("VmSize %q: %w", v, err)
			}
		}
	}
	if vmKiB == 0 {
		return fmt.Errorf("no VmSize in /proc/self/status")
	}
	lim := vmKiB<<10 + extra
	return unix.Setrlimit(unix.RLIMIT_AS, &unix.Rlimit{Cur: lim, Max: lim})
}

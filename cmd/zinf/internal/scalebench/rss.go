package scalebench

import (
	"os"
	"strconv"
	"strings"
)

// procStatus reads a "Name:   N kB" line of /proc/self/status, in bytes
// (0 when it cannot be read: not Linux).
func procStatus(file, key string) int64 {
	b, err := os.ReadFile(file)
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(line, key+":") {
			f := strings.Fields(line)
			if len(f) >= 2 {
				kb, err := strconv.ParseInt(f[1], 10, 64)
				if err == nil && kb >= 0 && kb < 1<<53 {
					return kb << 10
				}
			}
		}
	}
	return 0
}

// peakRSS is the process's peak resident set (VmHWM).
func peakRSS() int64 { return procStatus("/proc/self/status", "VmHWM") }

// memTotal is the machine's memory (MemTotal).
func memTotal() int64 { return procStatus("/proc/meminfo", "MemTotal") }

// resetPeakRSS sets the peak resident set back to the current one
// (Linux: writing 5 to /proc/self/clear_refs), so that a peak measured
// later is the training's, not the bandwidth probe's. Elsewhere it does
// nothing.
func resetPeakRSS() { _ = os.WriteFile("/proc/self/clear_refs", []byte("5"), 0) }

package scalebench

import "github.com/zinfio/zinf/metrics/procstat"

// peakRSS is the process's peak resident set (VmHWM).
func peakRSS() int64 { return procstat.PeakRSS() }

// memTotal is the machine's memory (MemTotal).
func memTotal() int64 { return procstat.MemTotal() }

// resetPeakRSS sets the peak resident set back to the current one, so that
// a peak measured later is the training's, not the bandwidth probe's.
func resetPeakRSS() { procstat.ResetPeakRSS() }

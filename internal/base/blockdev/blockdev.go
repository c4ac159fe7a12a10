// Package blockdev finds the block device under a path and reads its
// counters, so that zinf can say which device a swap path wears and what
// it has written (for SSD endurance: bytes written per device).
package blockdev

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Device is the whole disk under a path (a partition's parent disk: the
// unit an SSD's endurance rating applies to).
type Device struct {
	// Name is the kernel's name of the disk ("nvme0n1", "vda", "sda").
	Name string
	// Partition is the partition the path is on ("nvme0n1p2"), or "" when
	// the filesystem sits on the whole disk.
	Partition string
	// Major and Minor are the numbers of the filesystem's block device.
	Major, Minor uint32
}

// ErrNoDevice means the path's filesystem has no block device under it
// (tmpfs, overlay, a network filesystem) or the system does not say
// which.
var ErrNoDevice = errors.New("blockdev: no block device under the path")

// Of returns the disk under path.
func Of(path string) (Device, error) { return of(path) }

// Stat is a disk's cumulative counters since boot.
type Stat struct {
	// BytesRead and BytesWritten count what the disk transferred
	// (sectors of 512 bytes, as the kernel counts them).
	BytesRead, BytesWritten int64
	// Reads and Writes count completed requests.
	Reads, Writes int64
	// Busy is the time the disk had at least one request in flight
	// (io_ticks); InFlight the time requests spent in flight, summed over
	// the requests (time_in_queue), so that InFlight/Busy over an interval
	// is the average number in flight while busy. Both count in
	// milliseconds on Linux. Timed says the system gave them (ReadStat
	// only, not ProcessIO).
	Busy, InFlight time.Duration
	Timed          bool
}

// ReadStat reads a disk's counters (/sys/block/NAME/stat on Linux).
func ReadStat(name string) (Stat, error) { return readStat(name) }

// ProcessIO reads this process's storage I/O since it started: the bytes
// its threads (io_uring's workers included) made the block layer read and
// write (/proc/self/io read_bytes and write_bytes on Linux) — what a
// disk's counters see of this process alone, whatever else runs.
func ProcessIO() (Stat, error) { return processIO() }

// parseProcIO parses /proc/PID/io.
func parseProcIO(s string) (Stat, error) {
	var st Stat
	var seen int
	for _, line := range strings.Split(s, "\n") {
		k, v, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		var dst *int64
		switch strings.TrimSpace(k) {
		case "read_bytes":
			dst = &st.BytesRead
		case "write_bytes":
			dst = &st.BytesWritten
		default:
			continue
		}
		n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
		if err != nil || n < 0 {
			return Stat{}, fmt.Errorf("blockdev: io: %s is %q, not a count", strings.TrimSpace(k), strings.TrimSpace(v))
		}
		*dst = n
		seen++
	}
	if seen != 2 {
		return Stat{}, fmt.Errorf("blockdev: io lacks read_bytes or write_bytes: %q", s)
	}
	return st, nil
}

// parseStat parses the fields of /sys/block/NAME/stat (see the kernel's
// Documentation/block/stat.rst): reads completed, reads merged, sectors
// read, time reading, writes completed, writes merged, sectors written,
// time writing, in flight, io_ticks, time_in_queue, ... Sectors are 512
// bytes whatever the device's block size; the times are milliseconds.
func parseStat(s string) (Stat, error) {
	f := strings.Fields(s)
	if len(f) < 7 {
		return Stat{}, fmt.Errorf("blockdev: stat has %d fields, want at least 7: %q", len(f), s)
	}
	var v [7]int64
	for i := range v {
		n, err := strconv.ParseInt(f[i], 10, 64)
		if err != nil || n < 0 {
			return Stat{}, fmt.Errorf("blockdev: stat field %d is %q, not a count", i+1, f[i])
		}
		v[i] = n
	}
	const sector = 512
	if v[2] > (1<<63-1)/sector || v[6] > (1<<63-1)/sector {
		return Stat{}, fmt.Errorf("blockdev: stat sectors out of range: %q", s)
	}
	st := Stat{Reads: v[0], BytesRead: v[2] * sector, Writes: v[4], BytesWritten: v[6] * sector}
	if len(f) >= 11 {
		var t [2]int64
		for i := range t {
			n, err := strconv.ParseInt(f[9+i], 10, 64)
			if err != nil || n < 0 || n > int64(1<<63-1)/int64(time.Millisecond) {
				return Stat{}, fmt.Errorf("blockdev: stat field %d is %q, not a time in milliseconds", 10+i, f[9+i])
			}
			t[i] = n
		}
		st.Busy, st.InFlight, st.Timed = time.Duration(t[0])*time.Millisecond, time.Duration(t[1])*time.Millisecond, true
	}
	return st, nil
}

// Uptime is how long the system has been up: the span a disk's counters
// (ReadStat) cover.
func Uptime() (time.Duration, error) { return uptime() }

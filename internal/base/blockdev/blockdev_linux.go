package blockdev

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

func of(path string) (Device, error) {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return Device{}, fmt.Errorf("blockdev: %s: %w", path, err)
	}
	d := Device{Major: unix.Major(st.Dev), Minor: unix.Minor(st.Dev)}
	if d.Major == 0 {
		return d, fmt.Errorf("%w %s (device %d:%d is not a block device: tmpfs, overlay or a network filesystem)", ErrNoDevice, path, d.Major, d.Minor)
	}
	link := fmt.Sprintf("/sys/dev/block/%d:%d", d.Major, d.Minor)
	real, err := filepath.EvalSymlinks(link)
	if err != nil {
		return d, fmt.Errorf("%w %s (%s: %v)", ErrNoDevice, path, link, err)
	}
	d.Name = filepath.Base(real)
	// A partition's directory sits inside its disk's and has a
	// "partition" file.
	if _, err := os.Stat(filepath.Join(real, "partition")); err == nil {
		d.Partition = d.Name
		d.Name = filepath.Base(filepath.Dir(real))
	}
	return d, nil
}

func readStat(name string) (Stat, error) {
	if name == "" || strings.ContainsAny(name, "/\x00") || name == "." || name == ".." {
		return Stat{}, fmt.Errorf("blockdev: %q is not a disk name", name)
	}
	b, err := os.ReadFile(filepath.Join("/sys/block", name, "stat"))
	if err != nil {
		return Stat{}, fmt.Errorf("blockdev: %w", err)
	}
	return parseStat(string(b))
}

func processIO() (Stat, error) {
	b, err := os.ReadFile("/proc/self/io")
	if err != nil {
		return Stat{}, fmt.Errorf("blockdev: %w", err)
	}
	return parseProcIO(string(b))
}

func uptime() (time.Duration, error) {
	b, err := os.ReadFile("/proc/uptime")
	if err != nil {
		return 0, fmt.Errorf("blockdev: %w", err)
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return 0, fmt.Errorf("blockdev: /proc/uptime is empty")
	}
	s, err := strconv.ParseFloat(f[0], 64)
	if err != nil || s < 0 || s > 1e12 {
		return 0, fmt.Errorf("blockdev: /proc/uptime: %q is not an uptime", f[0])
	}
	return time.Duration(s * float64(time.Second)), nil
}

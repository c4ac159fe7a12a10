package doctor

import (
	"fmt"
	"sort"
	"strings"

	"github.com/zinfio/zinf/internal/base/blockdev"
	"github.com/zinfio/zinf/policy"
)

// Endurance adds, per disk under the swap paths, what the disk has written
// since boot and at what rate per day, and, given the drives' endurance
// rating (ratingBytes > 0: zinf doctor --tbw), what share of it a day at
// that rate spends. Paths without a block device (tmpfs) are said to be
// so. The checks are informational: they never make a path unusable.
func (r *Report) Endurance(paths []string, ratingBytes int64) {
	byDisk := map[string][]string{}
	for _, p := range paths {
		d, err := blockdev.Of(p)
		if err != nil {
			r.add("endurance "+p, true, "%v", err)
			continue
		}
		byDisk[d.Name] = append(byDisk[d.Name], p)
	}
	disks := make([]string, 0, len(byDisk))
	for d := range byDisk {
		disks = append(disks, d)
	}
	sort.Strings(disks)
	up, upErr := blockdev.Uptime()
	for _, d := range disks {
		name := "endurance " + d
		st, err := blockdev.ReadStat(d)
		if err != nil {
			r.add(name, true, "paths %s: %v", strings.Join(byDisk[d], ", "), err)
			continue
		}
		detail := fmt.Sprintf("disk %s (paths %s): %s written since boot", d, strings.Join(byDisk[d], ", "), policy.FormatDecimalBytes(float64(st.BytesWritten)))
		if upErr == nil && up > 0 {
			detail += fmt.Sprintf(" %.1f days ago", up.Hours()/24)
			// The rate since boot: the uptime as one long "step".
			e := policy.EnduranceOf(st.BytesWritten, up, ratingBytes)
			detail += fmt.Sprintf(", %s per day", policy.FormatDecimalBytes(e.WrittenPerDay))
			if ratingBytes > 0 {
				detail += fmt.Sprintf("; at that rate a day spends %.3g%% of the %s endurance rating (%.0f days to spend it all)",
					100*e.RatingPerDay, policy.FormatDecimalBytes(float64(ratingBytes)), e.RatingDays)
			}
		}
		if ratingBytes <= 0 {
			detail += "; give the drive's endurance rating (--tbw, or zinf.nvme_tbw in a config for zinf plan and train) to set writes against it"
		}
		r.add(name, true, "%s", detail)
	}
}

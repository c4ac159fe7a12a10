// Package units renders byte counts for people, one way for the whole
// tree. (Sizes are parsed by config.ParseSize, the one parser that flags and
// config files share.)
package units

import "fmt"

// FormatBytes renders n in binary units with one decimal ("1.5 GiB",
// "512 B"); negative counts keep their sign.
func FormatBytes(n int64) string {
	const unit = 1024
	if n < 0 {
		if n == -n { // math.MinInt64 has no positive counterpart
			return fmt.Sprintf("%d B", n)
		}
		return "-" + FormatBytes(-n)
	}
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	names := []string{"KiB", "MiB", "GiB", "TiB", "PiB", "EiB"}
	v := float64(n) / unit
	i := 0
	for v >= unit && i < len(names)-1 {
		v /= unit
		i++
	}
	return fmt.Sprintf("%.1f %s", v, names[i])
}

// FormatBytesExact renders n for messages where the reader may need the
// precise figure (a limit, a request refused): up to four significant digits
// in the largest binary unit, then the exact count ("8 MiB (8388608
// bytes)", "1.5 GiB (1610612736 bytes)"); counts under 1 KiB are just "512
// bytes".
func FormatBytesExact(n int64) string {
	const names = "KMGTPE"
	if n < 1024 {
		return fmt.Sprintf("%d bytes", n)
	}
	v, i := float64(n)/1024, 0
	for v >= 1024 && i < len(names)-1 {
		v /= 1024
		i++
	}
	return fmt.Sprintf("%.4g %ciB (%d bytes)", v, names[i], n)
}

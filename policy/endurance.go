package policy

import (
	"fmt"
	"math"
	"time"
)

// Endurance is what a training run's writes cost an SSD: the bytes it
// writes per step and per day, set against the drive's endurance rating
// (TBW, terabytes written, from its datasheet) when one is given.
type Endurance struct {
	// WrittenPerStep is the bytes one step writes to the drive(s) counted;
	// StepTime the step time they are spread over.
	WrittenPerStep int64
	StepTime       time.Duration
	// WrittenPerDay is WrittenPerStep over a day of back-to-back steps.
	WrittenPerDay float64
	// RatingBytes is the endurance rating (0: not given). RatingPerDay is
	// the fraction of it a day of training writes, RatingDays the days of
	// training that write all of it (+Inf when a step writes nothing).
	RatingBytes  int64
	RatingPerDay float64
	RatingDays   float64
}

// EnduranceOf works out what writing writtenPerStep bytes every step
// costs a drive rated for ratingBytes (0: no rating, the per-day figure
// only). A step time of 0 (unknown) leaves the per-day figures at 0.
func EnduranceOf(writtenPerStep int64, step time.Duration, ratingBytes int64) Endurance {
	e := Endurance{WrittenPerStep: writtenPerStep, StepTime: step, RatingBytes: ratingBytes}
	if step <= 0 || writtenPerStep < 0 {
		return e
	}
	e.WrittenPerDay = float64(writtenPerStep) * float64(24*time.Hour) / float64(step)
	if ratingBytes > 0 {
		e.RatingPerDay = e.WrittenPerDay / float64(ratingBytes)
		e.RatingDays = math.Inf(1)
		if e.WrittenPerDay > 0 {
			e.RatingDays = float64(ratingBytes) / e.WrittenPerDay
		}
	}
	return e
}

// String is one line: per step, per day, and against the rating.
func (e Endurance) String() string {
	s := fmt.Sprintf("%s (%d bytes) written per step", FormatBytes(e.WrittenPerStep), e.WrittenPerStep)
	if e.StepTime <= 0 {
		return s + " (step time unknown: no daily figure)"
	}
	s += fmt.Sprintf("; at %s per step, %s per day", formatDuration(e.StepTime), FormatDecimalBytes(e.WrittenPerDay))
	if e.RatingBytes > 0 {
		days := "never reached"
		if !math.IsInf(e.RatingDays, 1) {
			days = fmt.Sprintf("reached after %.0f days of training", e.RatingDays)
			if e.RatingDays < 10 {
				days = fmt.Sprintf("reached after %.1f days of training", e.RatingDays)
			}
		}
		s += fmt.Sprintf(" = %.3g%% of a %s endurance rating per day (%s)", 100*e.RatingPerDay, FormatDecimalBytes(float64(e.RatingBytes)), days)
	}
	return s
}

// FormatDecimalBytes writes bytes in decimal units, as drive ratings are
// given (TB = 10^12 bytes), to three significant digits.
func FormatDecimalBytes(b float64) string {
	for _, u := range []struct {
		n    float64
		name string
	}{{1e15, "PB"}, {1e12, "TB"}, {1e9, "GB"}, {1e6, "MB"}, {1e3, "kB"}} {
		if b >= u.n {
			return fmt.Sprintf("%.3g %s", b/u.n, u.name)
		}
	}
	return fmt.Sprintf("%.0f B", b)
}

func formatDuration(d time.Duration) string {
	switch {
	case d >= time.Second:
		return fmt.Sprintf("%.2f s", d.Seconds())
	case d >= time.Millisecond:
		return fmt.Sprintf("%.1f ms", float64(d)/1e6)
	}
	return d.String()
}

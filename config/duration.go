package config

import (
	"encoding/json"
	"errors"
	"math"
	"strconv"
	"strings"
	"time"
)

// Duration is a span of time in a config file: a string Go's
// time.ParseDuration reads ("90s", "2m", "1h30m", "500ms") or a JSON number
// of seconds (150, 0.5).
type Duration time.Duration

// String returns the duration as time.Duration prints it ("2m0s").
func (d Duration) String() string { return time.Duration(d).String() }

// MarshalJSON writes the duration as a string ParseDuration reads back.
func (d Duration) MarshalJSON() ([]byte, error) { return json.Marshal(d.String()) }

var errDurationRange = errors.New("duration out of range")

// parseDuration reads a duration string, or a number of seconds when
// number is true.
func parseDuration(text string, number bool) (Duration, error) {
	if number {
		s, err := strconv.ParseFloat(text, 64)
		if err != nil || math.IsNaN(s) || math.Abs(s) > float64(math.MaxInt64)/1e9 {
			return 0, errDurationRange
		}
		return Duration(time.Duration(s * 1e9)), nil
	}
	d, err := time.ParseDuration(strings.TrimSpace(text))
	if err != nil {
		if strings.Contains(err.Error(), "invalid duration") || strings.Contains(err.Error(), "unknown unit") || strings.Contains(err.Error(), "missing unit") {
			return 0, err
		}
		return 0, errDurationRange
	}
	return Duration(d), nil
}

func durationInto(p *Duration) reader {
	return func(d *decoder, n *node, key string) {
		const allowed = `a duration: a string such as "90s", "2m", "1h30m", or a number of seconds`
		if n.kind != kNumber && n.kind != kString {
			d.valueProblem(n, key, "is "+n.kind.String()+", not a duration", allowed)
			return
		}
		v, err := parseDuration(n.str, n.kind == kNumber)
		switch {
		case err == errDurationRange:
			d.valueProblem(n, key, "is out of range", allowed)
		case err != nil:
			d.valueProblem(n, key, "is not a duration", allowed)
		default:
			*p = v
		}
	}
}

// durationLimits holds the inclusive range of each duration key; Validate
// checks it.
var durationLimits = map[string][2]Duration{
	"zinf.pinned_stall_timeout":   {Duration(time.Second), Duration(24 * time.Hour)},
	"zinf.comm_stall_timeout":     {Duration(time.Second), Duration(24 * time.Hour)},
	"zinf.comm_heartbeat_timeout": {Duration(time.Second), Duration(time.Hour)},
}

func (k *checker) durationLimit(key string, v Duration) {
	l := durationLimits[key]
	if v < l[0] || v > l[1] {
		k.add(key, strconv.Quote(v.String()), "is out of range", "from "+l[0].String()+" to "+l[1].String())
	}
}

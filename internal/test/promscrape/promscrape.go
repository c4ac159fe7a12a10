// Package promscrape reads the Prometheus text exposition format, enough
// for zinf's tests to scrape /metrics and look values up: one sample per
// line, "name{label="value",...} value", comments skipped.
package promscrape

import (
	"bufio"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// Sample is one line: a series and its value.
type Sample struct {
	Name   string
	Labels map[string]string
	Value  float64
}

// Samples are a scrape's samples in order.
type Samples []Sample

// Get scrapes url (a /metrics endpoint).
func Get(url string) (Samples, error) {
	c := http.Client{Timeout: 10 * time.Second}
	resp, err := c.Get(url)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("promscrape: %s: %s", url, resp.Status)
	}
	return Parse(resp.Body)
}

// Parse reads the text format.
func Parse(r io.Reader) (Samples, error) {
	var out Samples
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || line[0] == '#' {
			continue
		}
		s := Sample{Labels: map[string]string{}}
		rest := line
		if i := strings.IndexAny(rest, "{ "); i < 0 {
			return nil, fmt.Errorf("promscrape: line %d: %q has no value", n, line)
		} else {
			s.Name, rest = rest[:i], rest[i:]
		}
		if rest[0] == '{' {
			rest = rest[1:]
			for {
				if rest != "" && rest[0] == '}' {
					rest = rest[1:]
					break
				}
				eq := strings.Index(rest, "=\"")
				if eq < 0 {
					return nil, fmt.Errorf("promscrape: line %d: bad labels in %q", n, line)
				}
				name := rest[:eq]
				rest = rest[eq+2:]
				var val strings.Builder
				for rest != "" && rest[0] != '"' {
					if rest[0] == '\\' && len(rest) > 1 {
						switch rest[1] {
						case 'n':
							val.WriteByte('\n')
						default:
							val.WriteByte(rest[1])
						}
						rest = rest[2:]
						continue
					}
					val.WriteByte(rest[0])
					rest = rest[1:]
				}
				if rest == "" {
					return nil, fmt.Errorf("promscrape: line %d: unterminated label in %q", n, line)
				}
				rest = strings.TrimPrefix(rest[1:], ",")
				s.Labels[name] = val.String()
			}
		}
		f := strings.Fields(rest)
		if len(f) == 0 {
			return nil, fmt.Errorf("promscrape: line %d: %q has no value", n, line)
		}
		v, err := strconv.ParseFloat(f[0], 64)
		if err != nil {
			return nil, fmt.Errorf("promscrape: line %d: value %q: %w", n, f[0], err)
		}
		s.Value = v
		out = append(out, s)
	}
	return out, sc.Err()
}

// Sum adds the values of the samples named name whose labels include
// every pair in match; ok is false when none matched.
func (s Samples) Sum(name string, match map[string]string) (sum float64, ok bool) {
	for _, x := range s {
		if x.Name != name {
			continue
		}
		all := true
		for k, v := range match {
			if x.Labels[k] != v {
				all = false
				break
			}
		}
		if all {
			sum += x.Value
			ok = true
		}
	}
	return sum, ok
}

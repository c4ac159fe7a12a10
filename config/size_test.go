package config

import (
	"encoding/json"
	"errors"
	"math"
	"strings"
	"testing"
)

func TestParseSize(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want int64
	}{
		{"0", 0},
		{"100", 100},
		{"100B", 100},
		{"1e9", 1_000_000_000},
		{"1E3", 1000},
		{"512KiB", 512 << 10},
		{"64MiB", 64 << 20},
		{"4GiB", 4 << 30},
		{"2TiB", 2 << 40},
		{"1PiB", 1 << 50},
		{"1.5GB", 1_500_000_000},
		{"1.5GiB", 3 << 29},
		{"10KB", 10_000},
		{"10MB", 10_000_000},
		{"3TB", 3_000_000_000_000},
		{"1G", 1 << 30},
		{"8k", 8 << 10},
		{"4 gib", 4 << 30},
		{"  64mib  ", 64 << 20},
		{"0.5KiB", 512},
		{".5KiB", 512},
		{"2.KiB", 2048},
		{"1.25e3", 1250},
		{"1e-3KB", 1},
		{"+7", 7},
		{"7EiB", 7 << 60},
		{"9223372036854775807", math.MaxInt64},
	} {
		got, err := ParseSize(tc.in)
		if err != nil || got != tc.want {
			t.Errorf("ParseSize(%q) = %d, %v; want %d", tc.in, got, err, tc.want)
		}
	}
}

func TestParseSizeErrors(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want error
	}{
		{"", errSizeSyntax},
		{"GiB", errSizeSyntax},
		{"4 GiBs", errSizeSyntax},
		{"4XB", errSizeSyntax},
		{"four", errSizeSyntax},
		{"1/2", errSizeSyntax},
		{"0x10", errSizeSyntax},
		{"Inf", errSizeSyntax},
		{"NaN", errSizeSyntax},
		{"1..5", errSizeSyntax},
		{"1e", errSizeSyntax}, // no bare "E" unit: it would read as an exponent
		{"1E", errSizeSyntax},
		{"--1", errSizeSyntax},
		{"1e+-3", errSizeSyntax},
		{"-1", errSizeRange},
		{"-1KiB", errSizeRange},
		{"8EiB", errSizeRange},
		{"9223372036854775808", errSizeRange},
		{"1e99", errSizeRange},
		{"1e999999999999", errSizeRange},
		{"1.5", errSizeFraction},
		{"0.1KiB", errSizeFraction},
		{"1e-3", errSizeFraction},
	} {
		_, err := ParseSize(tc.in)
		if !errors.Is(err, tc.want) {
			t.Errorf("ParseSize(%q) error = %v; want %v", tc.in, err, tc.want)
		}
		if err != nil && !strings.Contains(err.Error(), tc.in) {
			t.Errorf("ParseSize(%q) error %q does not quote the input", tc.in, err)
		}
	}
}

func TestSizeString(t *testing.T) {
	for _, tc := range []struct {
		in   Size
		want string
	}{
		{0, "0B"},
		{1, "1B"},
		{1000, "1KB"},
		{1024, "1KiB"},
		{1536, "1536B"},
		{1536 * MiB, "1536MiB"},
		{4 * GiB, "4GiB"},
		{256 * MiB, "256MiB"},
		{1e8, "100MB"},
		{1e9, "1GB"},
		{12345, "12345B"},
		{-4 * KiB, "-4KiB"},
		{7 << 60, "7EiB"},
		{math.MinInt64, "-9223372036854775808B"},
	} {
		if got := tc.in.String(); got != tc.want {
			t.Errorf("Size(%d).String() = %q; want %q", int64(tc.in), got, tc.want)
		}
		if tc.in >= 0 {
			back, err := ParseSize(tc.in.String())
			if err != nil || Size(back) != tc.in {
				t.Errorf("ParseSize(%q) = %d, %v; want %d", tc.in.String(), back, err, int64(tc.in))
			}
		}
	}
}

func TestSizeJSON(t *testing.T) {
	var v struct{ A, B, C Size }
	if err := json.Unmarshal([]byte(`{"A": 1048576, "B": "4GiB", "C": 1e9}`), &v); err != nil {
		t.Fatal(err)
	}
	if v.A != MiB || v.B != 4*GiB || v.C != GB {
		t.Fatalf("got %+v", v)
	}
	out, err := json.Marshal(v)
	if err != nil || string(out) != `{"A":1048576,"B":4294967296,"C":1000000000}` {
		t.Fatalf("Marshal = %s, %v", out, err)
	}
	if err := json.Unmarshal([]byte(`{"A": null}`), &v); err != nil || v.A != MiB {
		t.Errorf("null: %v, %d", err, v.A)
	}
	for _, bad := range []string{`{"A": "lots"}`, `{"A": -1}`, `{"A": 1.5}`, `{"A": true}`} {
		if err := json.Unmarshal([]byte(bad), &v); err == nil {
			t.Errorf("Unmarshal(%s) succeeded", bad)
		}
	}
}

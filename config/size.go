package config

import (
	"encoding/json"
	"errors"
	"fmt"
	"math/big"
	"strconv"
	"strings"
)

// Size is a number of bytes. In a config file it is written either as a JSON
// number (1048576, 1e9) or as a string with a unit ("4GiB", "64MiB",
// "1.5GB", "512KiB", "100"); see ParseSize for the units.
type Size int64

// Byte multiples. Binary (IEC) units are powers of 1024, decimal (SI) units
// powers of 1000.
const (
	KiB Size = 1 << 10
	MiB Size = 1 << 20
	GiB Size = 1 << 30
	TiB Size = 1 << 40
	PiB Size = 1 << 50

	KB Size = 1e3
	MB Size = 1e6
	GB Size = 1e9
	TB Size = 1e12
	PB Size = 1e15
)

// sizeUnits maps a lower-cased unit to its multiple. The single letters are
// binary, as in dd, fio and DeepSpeed's ds_io ("1G" is 1GiB); decimal units
// need their B ("1GB" is 10^9).
var sizeUnits = map[string]int64{
	"": 1, "b": 1,
	"k": 1 << 10, "kib": 1 << 10, "kb": 1e3,
	"m": 1 << 20, "mib": 1 << 20, "mb": 1e6,
	"g": 1 << 30, "gib": 1 << 30, "gb": 1e9,
	"t": 1 << 40, "tib": 1 << 40, "tb": 1e12,
	"p": 1 << 50, "pib": 1 << 50, "pb": 1e15,
	"eib": 1 << 60, "eb": 1e18, // no bare "e": "1e" reads as a broken exponent
}

// errSizeSyntax, errSizeFraction and errSizeRange classify ParseSize
// failures so that config problems can say "is not a size" or "is out of
// range" without parsing the message.
var (
	errSizeSyntax   = errors.New("not a size")
	errSizeFraction = errors.New("not a whole number of bytes")
	errSizeRange    = errors.New("out of range")
)

// maxExponent bounds the decimal exponent ParseSize accepts. Anything larger
// overflows int64 anyway, and the bound keeps "1e999999999" from making
// math/big build a gigantic number.
const maxExponent = 40

// ParseSize parses a byte count such as "4GiB", "64MiB", "1.5GB", "512KiB",
// "1e9" or "100". The number may have a fraction and an exponent; the result
// must be a whole number of bytes that fits in an int64 and is not negative.
// Units are case-insensitive and may be separated from the number by spaces:
//
//	B                    bytes (also no unit)
//	KiB MiB GiB TiB PiB  binary: 1024, 1024^2, ...
//	KB  MB  GB  TB  PB   decimal: 1000, 1000^2, ...
//	K   M   G   T   P    binary, as in dd, fio and ds_io ("1G" = 1GiB)
func ParseSize(s string) (int64, error) {
	n, err := parseSize(s)
	if err != nil {
		return 0, fmt.Errorf("config: size %q: %w", s, err)
	}
	return n, nil
}

func parseSize(s string) (int64, error) {
	s = strings.TrimSpace(s)
	i := 0
	for i < len(s) && (s[i] >= '0' && s[i] <= '9' || s[i] == '.' || s[i] == '+' || s[i] == '-' ||
		((s[i] == 'e' || s[i] == 'E') && i+1 < len(s) && (s[i+1] >= '0' && s[i+1] <= '9' || s[i+1] == '+' || s[i+1] == '-'))) {
		i++
	}
	num, unit := s[:i], strings.ToLower(strings.TrimSpace(s[i:]))
	mult, ok := sizeUnits[unit]
	if !ok || num == "" {
		return 0, errSizeSyntax
	}
	r, err := parseDecimal(num)
	if err != nil {
		return 0, err
	}
	if r.Sign() < 0 {
		return 0, errSizeRange
	}
	r.Mul(r, new(big.Rat).SetInt64(mult))
	if !r.IsInt() {
		return 0, errSizeFraction
	}
	if !r.Num().IsInt64() {
		return 0, errSizeRange
	}
	return r.Num().Int64(), nil
}

// parseDecimal reads a plain decimal number with an optional sign, fraction
// and exponent ("-1.5e3") exactly. It refuses the other forms math/big
// accepts ("1/3", "0x10", "Inf") and exponents beyond maxExponent.
func parseDecimal(s string) (*big.Rat, error) {
	mant, exp := s, ""
	if i := strings.IndexAny(s, "eE"); i >= 0 {
		mant, exp = s[:i], s[i+1:]
	}
	if mant != "" && (mant[0] == '-' || mant[0] == '+') {
		mant = mant[1:]
	}
	intPart, frac, hasDot := strings.Cut(mant, ".")
	if !digits(intPart) && intPart != "" || !digits(frac) && frac != "" || intPart == "" && frac == "" ||
		hasDot && strings.ContainsRune(frac, '.') {
		return nil, errSizeSyntax
	}
	if strings.ContainsAny(s, "eE") {
		e := strings.TrimLeft(exp, "+-")
		if len(exp)-len(e) > 1 || !digits(e) {
			return nil, errSizeSyntax
		}
		e = strings.TrimLeft(e, "0")
		if v, err := strconv.Atoi("0" + e); err != nil || len(e) > 4 || v > maxExponent {
			return nil, errSizeRange
		}
	}
	r, ok := new(big.Rat).SetString(s)
	if !ok {
		return nil, errSizeSyntax
	}
	return r, nil
}

func digits(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}

// String renders the size in the largest unit that represents it exactly,
// binary units first: 4GiB, 1536MiB, 100MB, 12345B. ParseSize reads every
// string String returns.
func (s Size) String() string {
	if s == 0 {
		return "0B"
	}
	v := int64(s)
	neg := v < 0
	if neg {
		if v == -v { // math.MinInt64 has no positive counterpart
			return strconv.FormatInt(v, 10) + "B"
		}
		v = -v
	}
	out := strconv.FormatInt(v, 10) + "B"
	for _, u := range []struct {
		name string
		mult int64
	}{
		{"EiB", 1 << 60}, {"PiB", 1 << 50}, {"TiB", 1 << 40}, {"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10},
		{"EB", 1e18}, {"PB", 1e15}, {"TB", 1e12}, {"GB", 1e9}, {"MB", 1e6}, {"KB", 1e3},
	} {
		if v%u.mult == 0 {
			out = strconv.FormatInt(v/u.mult, 10) + u.name
			break
		}
	}
	if neg {
		return "-" + out
	}
	return out
}

// UnmarshalJSON accepts a JSON number or a string for ParseSize. JSON null
// leaves the size unchanged, as encoding/json does for other types.
func (s *Size) UnmarshalJSON(data []byte) error {
	text := strings.TrimSpace(string(data))
	if text == "null" {
		return nil
	}
	if strings.HasPrefix(text, `"`) {
		var str string
		if err := json.Unmarshal(data, &str); err != nil {
			return err
		}
		n, err := ParseSize(str)
		if err != nil {
			return err
		}
		*s = Size(n)
		return nil
	}
	n, err := parseSize(text)
	if err != nil || !isJSONNumber(text) {
		return fmt.Errorf("config: size %s: %w", text, errSizeSyntax)
	}
	*s = Size(n)
	return nil
}

// MarshalJSON writes the size as a plain JSON number of bytes, the form
// DeepSpeed's own parser reads.
func (s Size) MarshalJSON() ([]byte, error) {
	return []byte(strconv.FormatInt(int64(s), 10)), nil
}

// isJSONNumber reports whether text is a JSON number (no unit, no spaces).
func isJSONNumber(text string) bool {
	return json.Valid([]byte(text)) && text != "" && (text[0] == '-' || text[0] >= '0' && text[0] <= '9')
}

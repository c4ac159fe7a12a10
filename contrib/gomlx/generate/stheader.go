package generate

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sort"
	"strconv"

	"github.com/zinfio/zinf/tensor"
)

// Bounds on what one SafetensorsWeights call keeps of its headers. A
// header may be 100 MB (the format's limit) and hold a million entries;
// decoding it whole (a map of raw messages, then each entry) cost several
// times its size, per shard. The header is read as a stream instead, and
// what is kept is bounded whatever the files say: a real model has a few
// thousand tensors with names of a few dozen bytes.
const (
	// maxTensors bounds the tensors of all the files together.
	maxTensors = 1 << 18
	// maxNameBytes bounds a tensor's name, maxNamesBytes all the names.
	maxNameBytes  = 1 << 12
	maxNamesBytes = 32 << 20
	// maxRank bounds a tensor's dimensions.
	maxRank = 16
	// maxDepth bounds the nesting of a value skipped (an unknown field).
	maxDepth = 64
)

// hdrReader reads a safetensors header's JSON from a stream, keeping only
// the tensors' compact records: the metadata and unknown fields are
// checked and skipped byte by byte, never held.
type hdrReader struct {
	r   *bufio.Reader
	buf []byte // scratch for a string or a number
}

var errHdrEOF = errors.New("the header ends inside its JSON")

func (h *hdrReader) byte() (byte, error) {
	c, err := h.r.ReadByte()
	if err == io.EOF {
		return 0, errHdrEOF
	}
	return c, err
}

// peek skips whitespace and returns the next byte, unread.
func (h *hdrReader) peek() (byte, error) {
	for {
		c, err := h.byte()
		if err != nil {
			return 0, err
		}
		if c != ' ' && c != '\t' && c != '\n' && c != '\r' {
			return c, h.r.UnreadByte()
		}
	}
}

// expect skips whitespace and reads c.
func (h *hdrReader) expect(c byte) error {
	got, err := h.peek()
	if err != nil {
		return err
	}
	h.r.ReadByte()
	if got != c {
		return fmt.Errorf("%q where %q belongs", got, c)
	}
	return nil
}

// str reads a JSON string (whitespace, then its quote) of at most max
// bytes as written, and returns it decoded; keep false checks and skips
// it, however long.
func (h *hdrReader) str(max int, keep bool) (string, error) {
	b, err := h.strBytes(max, keep)
	if err != nil || !keep {
		return "", err
	}
	return string(b), nil
}

// strBytes is str's string as bytes, valid until the next read (no
// allocation for a string without escapes).
func (h *hdrReader) strBytes(max int, keep bool) ([]byte, error) {
	if err := h.expect('"'); err != nil {
		return nil, err
	}
	h.buf = append(h.buf[:0], '"')
	n := 0
	escaped := false
	for {
		c, err := h.byte()
		if err != nil {
			return nil, err
		}
		n++
		if keep {
			if n > max+1 {
				return nil, fmt.Errorf("a string longer than %d bytes", max)
			}
			h.buf = append(h.buf, c)
		}
		switch {
		case c == '"':
			if !keep {
				return nil, nil
			}
			if !escaped {
				return h.buf[1 : len(h.buf)-1], nil
			}
			var s string
			if err := json.Unmarshal(h.buf, &s); err != nil {
				return nil, err
			}
			return []byte(s), nil
		case c < 0x20:
			return nil, fmt.Errorf("control character %#x in a string", c)
		case c == '\\':
			escaped = true
			e, err := h.byte()
			if err != nil {
				return nil, err
			}
			if keep {
				h.buf = append(h.buf, e)
			}
			switch e {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
			case 'u':
				for range 4 {
					x, err := h.byte()
					if err != nil {
						return nil, err
					}
					if !(x >= '0' && x <= '9' || x >= 'a' && x <= 'f' || x >= 'A' && x <= 'F') {
						return nil, fmt.Errorf("bad \\u escape in a string")
					}
					if keep {
						h.buf = append(h.buf, x)
					}
				}
			default:
				return nil, fmt.Errorf("bad escape \\%c in a string", e)
			}
		}
	}
}

// int reads a non-negative JSON integer (at most 2^53).
func (h *hdrReader) int() (int64, error) {
	if _, err := h.peek(); err != nil {
		return 0, err
	}
	h.buf = h.buf[:0]
	for {
		c, err := h.byte()
		if err != nil {
			return 0, err
		}
		if c < '0' || c > '9' {
			h.r.UnreadByte()
			break
		}
		if h.buf = append(h.buf, c); len(h.buf) > 16 {
			return 0, fmt.Errorf("integer %s... too large", h.buf)
		}
	}
	if len(h.buf) == 0 || len(h.buf) > 1 && h.buf[0] == '0' {
		return 0, fmt.Errorf("not a non-negative integer at %q", h.buf)
	}
	n, err := strconv.ParseInt(string(h.buf), 10, 64)
	if err != nil || n > 1<<53 {
		return 0, fmt.Errorf("integer %s too large", h.buf)
	}
	return n, nil
}

// ints reads an array of at most max non-negative integers, appended to
// out.
func (h *hdrReader) ints(out []int64, max int) ([]int64, error) {
	if err := h.expect('['); err != nil {
		return nil, err
	}
	if c, err := h.peek(); err != nil {
		return nil, err
	} else if c == ']' {
		h.r.ReadByte()
		return out, nil
	}
	for {
		if len(out) == max {
			return nil, fmt.Errorf("more than %d values", max)
		}
		n, err := h.int()
		if err != nil {
			return nil, err
		}
		out = append(out, n)
		c, err := h.peek()
		if err != nil {
			return nil, err
		}
		h.r.ReadByte()
		if c == ']' {
			return out, nil
		}
		if c != ',' {
			return nil, fmt.Errorf("%q in an array", c)
		}
	}
}

// skip checks and skips any JSON value, nested at most maxDepth deep.
func (h *hdrReader) skip(depth int) error {
	if depth > maxDepth {
		return fmt.Errorf("values nested more than %d deep", maxDepth)
	}
	c, err := h.peek()
	if err != nil {
		return err
	}
	switch {
	case c == '"':
		_, err := h.str(0, false)
		return err
	case c == '{' || c == '[':
		h.r.ReadByte()
		end := byte('}')
		if c == '[' {
			end = ']'
		}
		if n, err := h.peek(); err != nil {
			return err
		} else if n == end {
			h.r.ReadByte()
			return nil
		}
		for {
			if c == '{' {
				if _, err := h.str(0, false); err != nil {
					return err
				}
				if err := h.expect(':'); err != nil {
					return err
				}
			}
			if err := h.skip(depth + 1); err != nil {
				return err
			}
			n, err := h.peek()
			if err != nil {
				return err
			}
			h.r.ReadByte()
			if n == end {
				return nil
			}
			if n != ',' {
				return fmt.Errorf("%q where ',' or %q belongs", n, end)
			}
		}
	default: // a number or a literal: its characters, then json's verdict
		h.buf = h.buf[:0]
		for {
			c, err := h.byte()
			if err != nil {
				return err
			}
			if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c == '-' || c == '+' || c == '.' || c == 'E') {
				h.r.UnreadByte()
				break
			}
			if h.buf = append(h.buf, c); len(h.buf) > 64 {
				return fmt.Errorf("a value %s... that is no JSON", h.buf)
			}
		}
		var v any
		if len(h.buf) == 0 || json.Unmarshal(h.buf, &v) != nil {
			return fmt.Errorf("%q is no JSON value", h.buf)
		}
		return nil
	}
}

// metadata checks and skips __metadata__: null or an object of strings,
// as the format defines it (nothing of it is used).
func (h *hdrReader) metadata() error {
	c, err := h.peek()
	if err != nil {
		return err
	}
	if c == 'n' {
		return h.skip(0)
	}
	if err := h.expect('{'); err != nil {
		return fmt.Errorf("__metadata__: %w (allowed: an object of strings)", err)
	}
	if c, err := h.peek(); err != nil {
		return err
	} else if c == '}' {
		h.r.ReadByte()
		return nil
	}
	for {
		if _, err := h.str(0, false); err != nil {
			return fmt.Errorf("__metadata__: %w", err)
		}
		if err := h.expect(':'); err != nil {
			return fmt.Errorf("__metadata__: %w", err)
		}
		if _, err := h.str(0, false); err != nil {
			return fmt.Errorf("__metadata__: %w (allowed: an object of strings)", err)
		}
		c, err := h.peek()
		if err != nil {
			return err
		}
		h.r.ReadByte()
		if c == '}' {
			return nil
		}
		if c != ',' {
			return fmt.Errorf("__metadata__: %q where ',' or '}' belongs", c)
		}
	}
}

// rawEntry is a tensor's entry as the header gives it.
type rawEntry struct {
	dtype      string
	shape      []int64
	offsets    []int64
	hasShape   bool
	hasOffsets bool
	offs       [2]int64 // offsets' memory
}

// entry reads one tensor's object: dtype, shape and data_offsets (other
// fields are skipped, as the format's readers do).
func (h *hdrReader) entry(e *rawEntry) error {
	*e = rawEntry{}
	if err := h.expect('{'); err != nil {
		return err
	}
	if c, err := h.peek(); err != nil {
		return err
	} else if c == '}' {
		h.r.ReadByte()
		return nil
	}
	for {
		kb, err := h.strBytes(64, true)
		if err != nil {
			return err
		}
		k := fieldName(kb)
		if err := h.expect(':'); err != nil {
			return err
		}
		switch k {
		case "dtype":
			b, err := h.strBytes(16, true)
			if err != nil {
				return fmt.Errorf("dtype: %w", err)
			}
			e.dtype = fieldName(b)
		case "shape":
			if e.shape, err = h.ints(make([]int64, 0, 4), maxRank); err != nil {
				return fmt.Errorf("shape: %w", err)
			}
			e.hasShape = true
		case "data_offsets":
			if e.offsets, err = h.ints(e.offs[:0], 2); err != nil {
				return fmt.Errorf("data_offsets: %w", err)
			}
			e.hasOffsets = true
		default:
			if err := h.skip(1); err != nil {
				return fmt.Errorf("%s: %w", k, err)
			}
		}
		c, err := h.peek()
		if err != nil {
			return err
		}
		h.r.ReadByte()
		if c == '}' {
			return nil
		}
		if c != ',' {
			return fmt.Errorf("%q where ',' or '}' belongs", c)
		}
	}
}

// fieldName returns b as a string, without allocating for the names a
// tensor's entry is made of.
func fieldName(b []byte) string {
	switch string(b) {
	case "dtype":
		return "dtype"
	case "shape":
		return "shape"
	case "data_offsets":
		return "data_offsets"
	case "F32":
		return "F32"
	case "BF16":
		return "BF16"
	case "F16":
		return "F16"
	}
	return string(b)
}

// readHeader reads the header's JSON (hl bytes from r) of path, whose data
// section (after the header) holds dataBytes, into w.entries: each tensor
// checked (a known dtype, a shape whose size its offsets hold, a name
// given once), then the tensors together as the format requires: back to
// back from the data section's start to its end, no holes, no overlaps,
// no trailing bytes.
func (w *STWeights) readHeader(path string, r io.Reader, hl, start, dataBytes int64) error {
	lr := &io.LimitedReader{R: r, N: hl}
	h := &hdrReader{r: bufio.NewReaderSize(lr, 64<<10)}
	fail := func(format string, args ...any) error {
		at := hl - lr.N - int64(h.r.Buffered())
		return fmt.Errorf("zinf generate: %s: header (byte %d of %d): %s", path, at, hl, fmt.Sprintf(format, args...))
	}
	if err := h.expect('{'); err != nil {
		return fail("%v (a safetensors header is a JSON object)", err)
	}
	var raw rawEntry
	metadata := false
	if c, err := h.peek(); err != nil {
		return fail("%v", err)
	} else if c == '}' {
		h.r.ReadByte()
	} else {
		for {
			k, err := h.str(maxNameBytes, true)
			if err != nil {
				return fail("a tensor's name: %v (allowed: a string of at most %d bytes)", err, maxNameBytes)
			}
			if err := h.expect(':'); err != nil {
				return fail("after %q: %v", k, err)
			}
			if prev, dup := w.entries[k]; (dup && prev.file == path) || (k == "__metadata__" && metadata) {
				return fail("%q appears twice (a name is given once)", k)
			}
			if k == "__metadata__" {
				metadata = true
				if err := h.metadata(); err != nil {
					return fail("%v", err)
				}
			} else {
				if len(w.entries) >= maxTensors {
					return fail("more than %d tensors (what a model's files hold is far fewer)", maxTensors)
				}
				if w.nameBytes += int64(len(k)); w.nameBytes > maxNamesBytes {
					return fail("tensor names of more than %d bytes together", maxNamesBytes)
				}
				if err := h.entry(&raw); err != nil {
					return fail("tensor %q: %v", k, err)
				}
				e, err := checkEntry(k, &raw, start, dataBytes)
				if err != nil {
					return fail("%v", err)
				}
				if prev, dup := w.entries[k]; dup {
					return fmt.Errorf("zinf generate: tensor %q is in two files (%s and %s)", k, prev.file, path)
				}
				e.file = path
				w.entries[k] = e
			}
			c, err := h.peek()
			if err != nil {
				return fail("%v", err)
			}
			h.r.ReadByte()
			if c == '}' {
				break
			}
			if c != ',' {
				return fail("%q where ',' or '}' belongs", c)
			}
		}
	}
	// The rest of the header: spaces (the padding the format allows).
	for {
		c, err := h.byte()
		if err == errHdrEOF {
			break
		}
		if err != nil {
			return fail("%v", err)
		}
		if c != ' ' && c != '\t' && c != '\n' && c != '\r' {
			return fail("%q after the JSON object (allowed: spaces)", c)
		}
	}
	if lr.N > 0 {
		return fail("the file ends inside the header")
	}
	// The file's tensors in data order (a slice made once, at its size).
	type span struct {
		name       string
		begin, end int64
	}
	n := 0
	for _, e := range w.entries {
		if e.file == path {
			n++
		}
	}
	spans := make([]span, 0, n)
	for k, e := range w.entries {
		if e.file == path {
			spans = append(spans, span{k, e.begin - start, e.end - start})
		}
	}
	sort.Slice(spans, func(i, j int) bool {
		if spans[i].begin != spans[j].begin {
			return spans[i].begin < spans[j].begin
		}
		if spans[i].end != spans[j].end {
			return spans[i].end < spans[j].end
		}
		// The entries come from a map: names break the tie, so the same
		// file gets the same message every time.
		return spans[i].name < spans[j].name
	})
	var at int64
	var prev string
	for _, s := range spans {
		switch {
		case s.begin > at:
			return fmt.Errorf("zinf generate: %s: tensor %q begins at data offset %d, %s ends at %d: a hole of %d bytes (the format has the tensors back to back)", path, s.name, s.begin, orStart(prev), at, s.begin-at)
		case s.begin < at:
			return fmt.Errorf("zinf generate: %s: tensor %q at data offsets [%d, %d] overlaps %q, which ends at %d (each byte belongs to one tensor)", path, s.name, s.begin, s.end, prev, at)
		}
		at, prev = s.end, s.name
	}
	if at != dataBytes {
		return fmt.Errorf("zinf generate: %s: the tensors end at data offset %d (%s), the file has %d bytes of data: %d trailing bytes (the format has none)", path, at, orStart(prev), dataBytes, dataBytes-at)
	}
	return nil
}

func orStart(name string) string {
	if name == "" {
		return "the data section's start"
	}
	return strconv.Quote(name)
}

// checkEntry checks one tensor's entry and returns its compact record
// (absolute offsets, start being the data section's).
func checkEntry(k string, raw *rawEntry, start, dataBytes int64) (stEntry, error) {
	var dt tensor.DType
	switch raw.dtype {
	case "F32":
		dt = tensor.Float32
	case "BF16":
		dt = tensor.BFloat16
	case "F16":
		dt = tensor.Float16
	default:
		return stEntry{}, fmt.Errorf("tensor %q: dtype %q (allowed: F32, BF16, F16)", k, raw.dtype)
	}
	if !raw.hasShape || !raw.hasOffsets {
		return stEntry{}, fmt.Errorf("tensor %q: no shape or no data_offsets (both are required)", k)
	}
	numel := int64(1)
	for _, d := range raw.shape {
		if d > 1<<40 || (d > 0 && numel > (1<<50)/d) {
			return stEntry{}, fmt.Errorf("tensor %q: shape %v", k, raw.shape)
		}
		numel *= d
	}
	o := raw.offsets
	if len(o) != 2 || o[1] < o[0] || o[1] > dataBytes || o[1]-o[0] != numel*int64(dt.Size()) {
		return stEntry{}, fmt.Errorf("tensor %q: data_offsets %v for %d %s values (the file has %d bytes of data)", k, o, numel, raw.dtype, dataBytes)
	}
	return stEntry{dtype: dt, shape: raw.shape, begin: start + o[0], end: start + o[1]}, nil
}

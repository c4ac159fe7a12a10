package config

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"unicode/utf8"
)

// node is one JSON value with the text it was written as and where. Parse
// builds a tree of nodes instead of unmarshalling into structs so that it can
// report unknown keys, duplicate keys and wrong types all at once, each with
// its path and position.
type node struct {
	kind    nodeKind
	members []member // kObject, in file order
	elems   []*node  // kArray
	str     string   // kString: the decoded string; kNumber: the number's text
	b       bool     // kBool
	raw     string   // the value as written, shortened for messages
	off     int      // byte offset of the value's first byte
}

type member struct {
	key    string
	keyOff int
	val    *node
}

type nodeKind int

const (
	kNull nodeKind = iota
	kBool
	kNumber
	kString
	kArray
	kObject
)

func (k nodeKind) String() string {
	return [...]string{"null", "a boolean", "a number", "a string", "an array", "an object"}[k]
}

// maxRaw bounds the length of a value quoted in a message.
const maxRaw = 60

// buildTree checks data strictly (encoding/json's scanner, so the error
// offsets are exact) and returns its tree. A syntax error comes back as a
// Problem with a line and column.
func buildTree(data []byte) (*node, *Problem) {
	if !json.Valid(data) {
		var raw json.RawMessage
		err := json.Unmarshal(data, &raw)
		if err == nil {
			err = errors.New("not valid JSON") // json.Valid and Unmarshal disagree: never seen
		}
		off := len(data)
		var se *json.SyntaxError
		if errors.As(err, &se) {
			off = int(se.Offset)
			if off > 0 && !strings.Contains(se.Error(), "unexpected end") {
				off-- // Offset counts the bytes read, the culprit included
			}
		}
		line, col := position(data, off)
		msg := err.Error()
		if len(data) == 0 || len(bytes.TrimSpace(data)) == 0 {
			msg = "the file is empty; a config is a JSON object such as {}"
		}
		return nil, &Problem{Msg: "invalid JSON: " + msg, Line: line, Column: col}
	}
	// Every member is written with a ':' (strings may hold more), and
	// takes at least 5 bytes ("":0,): room for them all up front, so the
	// stack they are collected in is not copied as it grows.
	t := &treeReader{data: data, text: string(data), members: make([]member, 0, min(bytes.Count(data, []byte{':'}), len(data)/5))}
	n, err := t.value()
	if err != nil {
		// Unreachable after the check above, but never panic on input.
		line, col := position(data, t.pos)
		return nil, &Problem{Msg: "invalid JSON: " + err.Error(), Line: line, Column: col}
	}
	return n, nil
}

// treeReader walks JSON text that json.Valid accepted, building nodes as
// it goes. It reads the bytes itself rather than through json.Decoder's
// tokens: those allocated several objects per value (an error value at the
// end of each one among them), which a file of many keys paid for in
// garbage collection. Strings with escapes or invalid UTF-8 are decoded by
// encoding/json, so every value reads as json.Unmarshal reads it. It still
// checks what it relies on, and returns an error instead of panicking on
// text it did not expect.
type treeReader struct {
	data []byte
	// text is data as one string: keys, numbers and texts for messages
	// are slices of it instead of a string each.
	text string
	pos  int
	// slab hands out nodes a batch at a time, not one allocation each.
	slab []node
	// members and elems are stacks the objects and arrays being read
	// collect their members in; each gets an exact copy when it ends
	// (appending to its own slice allocated it about five times over).
	members []member
	elems   []*node
}

func (t *treeReader) newNode(off int) *node {
	if len(t.slab) == 0 {
		t.slab = make([]node, 256)
	}
	n := &t.slab[0]
	t.slab = t.slab[1:]
	n.off = off
	return n
}

func (t *treeReader) skipSpace() {
	for t.pos < len(t.data) {
		switch t.data[t.pos] {
		case ' ', '\t', '\r', '\n':
			t.pos++
		default:
			return
		}
	}
}

// eat consumes c after white space, reporting whether it was there.
func (t *treeReader) eat(c byte) bool {
	t.skipSpace()
	if t.pos < len(t.data) && t.data[t.pos] == c {
		t.pos++
		return true
	}
	return false
}

func (t *treeReader) unexpected(what string) error {
	if t.pos >= len(t.data) {
		return fmt.Errorf("unexpected end of JSON input, want %s", what)
	}
	return fmt.Errorf("unexpected %q at offset %d, want %s", t.data[t.pos], t.pos, what)
}

// str reads a string at t.pos, returning its decoded value.
func (t *treeReader) str() (string, error) {
	if t.pos >= len(t.data) || t.data[t.pos] != '"' {
		return "", t.unexpected("a string")
	}
	start := t.pos
	plain := true
	i := start + 1
	for ; i < len(t.data); i++ {
		c := t.data[i]
		if c == '\\' {
			plain = false
			i++
			continue
		}
		if c == '"' {
			break
		}
		if c >= utf8.RuneSelf {
			plain = false
		}
	}
	if i >= len(t.data) {
		t.pos = len(t.data)
		return "", t.unexpected("the end of a string")
	}
	t.pos = i + 1
	body := t.data[start+1 : i]
	if plain || utf8.Valid(body) && bytes.IndexByte(body, '\\') < 0 {
		return t.text[start+1 : i], nil
	}
	var v string
	if err := json.Unmarshal(t.data[start:t.pos], &v); err != nil {
		return "", err
	}
	return v, nil
}

// rawText is the text of the value at data[start:end], shortened for
// messages.
func (t *treeReader) rawText(start, end int) string {
	cut := min(end, start+maxRaw+utf8.UTFMax)
	text := shorten(t.text[start:cut])
	if cut < end && len(text) <= maxRaw {
		text += "..."
	}
	return text
}

func (t *treeReader) value() (*node, error) {
	t.skipSpace()
	if t.pos >= len(t.data) {
		return nil, t.unexpected("a value")
	}
	start := t.pos
	n := t.newNode(start)
	switch c := t.data[t.pos]; c {
	case '{':
		t.pos++
		n.kind = kObject
		base := len(t.members)
		if !t.eat('}') {
			for {
				t.skipSpace()
				kstart := t.pos
				key, err := t.str()
				if err != nil {
					return nil, err
				}
				if !t.eat(':') {
					return nil, t.unexpected("':'")
				}
				val, err := t.value()
				if err != nil {
					return nil, err
				}
				t.members = append(t.members, member{key: key, keyOff: kstart, val: val})
				if t.eat(',') {
					continue
				}
				if t.eat('}') {
					break
				}
				return nil, t.unexpected("',' or '}'")
			}
		}
		if len(t.members) > base {
			n.members = slices.Clone(t.members[base:])
			clear(t.members[base:])
			t.members = t.members[:base]
		}
		n.raw = t.rawText(start, t.pos)
		return n, nil
	case '[':
		t.pos++
		n.kind = kArray
		base := len(t.elems)
		if !t.eat(']') {
			for {
				val, err := t.value()
				if err != nil {
					return nil, err
				}
				t.elems = append(t.elems, val)
				if t.eat(',') {
					continue
				}
				if t.eat(']') {
					break
				}
				return nil, t.unexpected("',' or ']'")
			}
		}
		if len(t.elems) > base {
			n.elems = slices.Clone(t.elems[base:])
			clear(t.elems[base:])
			t.elems = t.elems[:base]
		}
		n.raw = t.rawText(start, t.pos)
		return n, nil
	case '"':
		v, err := t.str()
		if err != nil {
			return nil, err
		}
		n.kind, n.str = kString, v
	case 't', 'f', 'n':
		for _, lit := range []string{"true", "false", "null"} {
			if bytes.HasPrefix(t.data[t.pos:], []byte(lit)) {
				t.pos += len(lit)
				n.kind, n.b = kBool, lit == "true"
				if lit == "null" {
					n.kind = kNull
				}
				break
			}
		}
		if t.pos == start {
			return nil, t.unexpected("a value")
		}
	default:
		for t.pos < len(t.data) && strings.IndexByte("+-0123456789.eE", t.data[t.pos]) >= 0 {
			t.pos++
		}
		if t.pos == start {
			return nil, t.unexpected("a value")
		}
		n.kind, n.str = kNumber, t.text[start:t.pos]
	}
	// A scalar's text is shortened as its token's was, then once more as
	// the node's (the same result as before this reader).
	n.raw = shorten(t.rawText(start, t.pos))
	return n, nil
}

// shorten cuts a value's text for a message, at a rune boundary.
func shorten(s string) string {
	if len(s) <= maxRaw {
		return s
	}
	// Back to the start of the rune the limit falls in: at most
	// UTFMax-1 bytes. Text that is not UTF-8 there (a string of
	// continuation bytes) is cut at the limit, not walked back to nothing.
	cut := maxRaw
	for back := 0; back < utf8.UTFMax-1 && cut > 0 && !utf8.RuneStart(s[cut]); back++ {
		cut--
	}
	if !utf8.RuneStart(s[cut]) {
		cut = maxRaw
	}
	return s[:cut] + "..."
}

// position turns a byte offset into a 1-based line and column. It scans
// data up to off: for one position. Many positions in one text use a
// lineIndex.
func position(data []byte, off int) (line, col int) {
	off = min(max(off, 0), len(data))
	line = 1 + bytes.Count(data[:off], []byte{'\n'})
	lineStart := bytes.LastIndexByte(data[:off], '\n') + 1
	return line, off - lineStart + 1
}

// lineIndex holds the offset where each line of a text starts, built in
// one pass, so that every problem's position is a binary search instead
// of a rescan of the text (which made 50,000 problems take 12 s).
type lineIndex struct {
	starts []int // starts[i] is the offset of line i+1's first byte
	size   int
}

func newLineIndex(data []byte) lineIndex {
	starts := []int{0}
	for i, b := range data {
		if b == '\n' {
			starts = append(starts, i+1)
		}
	}
	return lineIndex{starts: starts, size: len(data)}
}

// position is the 1-based line and column of off, as position(data, off).
func (x lineIndex) position(off int) (line, col int) {
	off = min(max(off, 0), x.size)
	// The last line starting at or before off.
	i := sort.Search(len(x.starts), func(i int) bool { return x.starts[i] > off }) - 1
	return i + 1, off - x.starts[i] + 1
}

package config

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
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
	var raw json.RawMessage
	if err := json.Unmarshal(data, &raw); err != nil {
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
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	t := &treeReader{dec: dec, data: data}
	n, err := t.value()
	if err != nil {
		// Unreachable after the check above, but never panic on input.
		line, col := position(data, int(dec.InputOffset()))
		return nil, &Problem{Msg: "invalid JSON: " + err.Error(), Line: line, Column: col}
	}
	return n, nil
}

type treeReader struct {
	dec  *json.Decoder
	data []byte
}

// token reads one token and where it starts. json.Decoder consumes the ','
// or ':' before a token together with it, so the start is found by skipping
// those and white space from the offset before the call.
func (t *treeReader) token() (json.Token, int, string, error) {
	before := int(t.dec.InputOffset())
	tok, err := t.dec.Token()
	if err != nil {
		return nil, before, "", err
	}
	after := int(t.dec.InputOffset())
	start := before
	for start < after {
		switch t.data[start] {
		case ' ', '\t', '\r', '\n', ',', ':':
			start++
			continue
		}
		break
	}
	end := min(after, start+maxRaw+utf8.UTFMax)
	text := shorten(string(t.data[start:end]))
	if end < after && len(text) <= maxRaw {
		text += "..."
	}
	return tok, start, text, nil
}

func (t *treeReader) value() (*node, error) {
	tok, start, text, err := t.token()
	if err != nil {
		return nil, err
	}
	return t.valueFrom(tok, start, text)
}

func (t *treeReader) valueFrom(tok json.Token, start int, text string) (*node, error) {
	n := &node{off: start, raw: shorten(text)}
	switch v := tok.(type) {
	case nil:
		n.kind = kNull
	case bool:
		n.kind, n.b = kBool, v
	case json.Number:
		n.kind, n.str = kNumber, string(v)
	case string:
		n.kind, n.str = kString, v
	case json.Delim:
		switch v {
		case '{':
			n.kind = kObject
			for t.dec.More() {
				ktok, kstart, _, err := t.token()
				if err != nil {
					return nil, err
				}
				key, ok := ktok.(string)
				if !ok {
					return nil, fmt.Errorf("object key is %T", ktok)
				}
				val, err := t.value()
				if err != nil {
					return nil, err
				}
				n.members = append(n.members, member{key: key, keyOff: kstart, val: val})
			}
		case '[':
			n.kind = kArray
			for t.dec.More() {
				val, err := t.value()
				if err != nil {
					return nil, err
				}
				n.elems = append(n.elems, val)
			}
		default:
			return nil, fmt.Errorf("unexpected %q", v)
		}
		if _, _, _, err := t.token(); err != nil { // the closing delimiter
			return nil, err
		}
		end := min(int(t.dec.InputOffset()), len(t.data), start+maxRaw+utf8.UTFMax)
		n.raw = shorten(string(t.data[start:end]))
		if end < int(t.dec.InputOffset()) && len(n.raw) <= maxRaw {
			n.raw += "..."
		}
	default:
		return nil, fmt.Errorf("unexpected token %T", tok)
	}
	return n, nil
}

// shorten cuts a value's text for a message, at a rune boundary.
func shorten(s string) string {
	if len(s) <= maxRaw {
		return s
	}
	cut := maxRaw
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
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

package config

import (
	"bytes"
	"encoding/json"
	"reflect"
	"testing"
)

// plainOf is a node as encoding/json decodes it into an interface value
// (numbers as json.Number; the last of duplicate keys wins).
func plainOf(n *node) any {
	switch n.kind {
	case kNull:
		return nil
	case kBool:
		return n.b
	case kNumber:
		return json.Number(n.str)
	case kString:
		return n.str
	case kArray:
		out := []any{}
		for _, e := range n.elems {
			out = append(out, plainOf(e))
		}
		return out
	}
	out := map[string]any{}
	for _, m := range n.members {
		out[m.key] = plainOf(m.val)
	}
	return out
}

// FuzzTreeMatchesDecoder: the tree of any valid JSON text holds what
// encoding/json decodes from it, each node's offset is where its value's
// text starts, and invalid text is a problem, never a panic.
func FuzzTreeMatchesDecoder(f *testing.F) {
	for _, s := range []string{
		`{}`, `[]`, `{"a":1}`, ` { "a" : [1, -2.5e+3, true, false, null, "x"] , "b":{}} `,
		`{"esc":"a\"b\\c\/d\u00e9\ud83d\ude00\n","é":"ü"}`, "{\"bad\":\"\xff\xfe\"}", `{"a":1,"a":2}`,
		`[[[[]]],{"":""}]`, `"str"`, `12`, `{"a":1,}`, `{"a" 1}`, `[1 2]`, `{`, ``, `nul`, "{\"k\":\"\x01\"}",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		n, p := buildTree(data)
		if !json.Valid(data) {
			if p == nil {
				t.Fatalf("invalid JSON %q built a tree", data)
			}
			return
		}
		if p != nil {
			t.Fatalf("valid JSON %q: %+v", data, p)
		}
		dec := json.NewDecoder(bytes.NewReader(data))
		dec.UseNumber()
		var want any
		if err := dec.Decode(&want); err != nil {
			t.Fatal(err)
		}
		if got := plainOf(n); !reflect.DeepEqual(got, want) {
			t.Fatalf("%q: tree %#v, encoding/json %#v", data, got, want)
		}
		var check func(n *node)
		check = func(n *node) {
			if n.off < 0 || n.off >= len(data) || !bytes.HasPrefix(data[n.off:], []byte(n.raw[:min(len(n.raw), 1)])) {
				t.Fatalf("%q: node at offset %d with text %q", data, n.off, n.raw)
			}
			for _, m := range n.members {
				if m.keyOff < 0 || m.keyOff >= len(data) || data[m.keyOff] != '"' {
					t.Fatalf("%q: key %q at offset %d", data, m.key, m.keyOff)
				}
				check(m.val)
			}
			for _, e := range n.elems {
				check(e)
			}
		}
		check(n)
	})
}

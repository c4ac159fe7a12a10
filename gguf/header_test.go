package gguf

import (
	"bytes"
	"encoding/binary"
	"errors"
	"strings"
	"testing"
)

// bld builds a header byte by byte, so that a test controls every field.
type bld struct{ bytes.Buffer }

func (b *bld) u32(v uint32) *bld { binary.Write(b, binary.LittleEndian, v); return b }
func (b *bld) u64(v uint64) *bld { binary.Write(b, binary.LittleEndian, v); return b }
func (b *bld) str(s string) *bld { b.u64(uint64(len(s))); b.WriteString(s); return b }

// head writes the magic, a version and the counts.
func (b *bld) head(version uint32, tensors, kvs uint64) *bld {
	b.WriteString("GGUF")
	return b.u32(version).u64(tensors).u64(kvs)
}

// tensor writes a tensor info.
func (b *bld) tensor(name string, dims []uint64, typ uint32, off uint64) *bld {
	b.str(name).u32(uint32(len(dims)))
	for _, d := range dims {
		b.u64(d)
	}
	return b.u32(typ).u64(off)
}

// data pads to 32 and appends n zero bytes.
func (b *bld) data(n int) *bld {
	for b.Len()%32 != 0 {
		b.WriteByte(0)
	}
	b.Write(make([]byte, n))
	return b
}

// hostile is the table of bad headers: each must give a FormatError whose
// text holds want.
var hostile = []struct {
	name string
	file func() []byte
	want string
}{
	{"empty", func() []byte { return nil }, "magic: a value of 4 bytes runs past the end"},
	{"bad magic", func() []byte { return []byte("GGML\x03\x00\x00\x00") }, `magic: "GGML", want "GGUF"`},
	{"version 1", func() []byte { return new(bld).head(1, 0, 0).Bytes() }, "version: 1 (the first version's"},
	{"version 9", func() []byte { return new(bld).head(9, 0, 0).Bytes() }, "version: 9 (allowed: 2, 3)"},
	{"big-endian", func() []byte { return new(bld).head(3<<24, 0, 0).Bytes() }, "big-endian"},
	{"truncated counts", func() []byte { return new(bld).head(3, 0, 0).Bytes()[:12] }, "tensor_count: a value of 8 bytes runs past the end"},
	{"huge tensor count", func() []byte { return new(bld).head(3, 1<<40, 0).Bytes() }, "tensor_count: 1099511627776 tensors (allowed: up to 1048576"},
	{"tensor count past the file", func() []byte { return new(bld).head(3, 1000, 0).data(64).Bytes() }, "tensor_count: 1000 tensors"},
	{"huge kv count", func() []byte { return new(bld).head(3, 0, 1<<62).Bytes() }, "metadata_kv_count: 4611686018427387904 metadata entries"},
	{"key longer than the file", func() []byte {
		return new(bld).head(3, 0, 1).u64(1 << 40).data(32).Bytes()
	}, "metadata 0 key: a string of 1099511627776 bytes is above the limit"},
	{"key past the end", func() []byte {
		return new(bld).head(3, 0, 1).u64(1000).data(32).Bytes()
	}, "metadata 0 key: a string of 1000 bytes runs past the end of the file"},
	{"string value past the end", func() []byte {
		return new(bld).head(3, 0, 1).str("k").u32(uint32(String)).u64(1 << 20).data(16).Bytes()
	}, "metadata k: a string of 1048576 bytes runs past the end"},
	{"unknown value type", func() []byte {
		return new(bld).head(3, 0, 1).str("k").u32(13).data(16).Bytes()
	}, "metadata k: value type 13 (allowed: 0..12)"},
	{"nested array", func() []byte {
		return new(bld).head(3, 0, 1).str("k").u32(uint32(Array)).u32(uint32(Array)).u64(1).data(16).Bytes()
	}, "array of value type 9"},
	{"huge array", func() []byte {
		return new(bld).head(3, 0, 1).str("k").u32(uint32(Array)).u32(uint32(Uint64)).u64(1 << 50).data(16).Bytes()
	}, "an array of 1125899906842624 uint64 values"},
	{"array past the end", func() []byte {
		return new(bld).head(3, 0, 1).str("k").u32(uint32(Array)).u32(uint32(String)).u64(100).data(16).Bytes()
	}, "an array of 100 string values"},
	{"bad bool", func() []byte {
		b := new(bld).head(3, 0, 1).str("k").u32(uint32(Bool))
		b.WriteByte(7)
		return b.data(16).Bytes()
	}, "bool 7 (allowed: 0, 1)"},
	{"duplicate key", func() []byte {
		return new(bld).head(3, 0, 2).str("k").u32(uint32(Uint32)).u32(1).str("k").u32(uint32(Uint32)).u32(2).data(16).Bytes()
	}, `key "k" appears twice`},
	{"alignment not a power of two", func() []byte {
		return new(bld).head(3, 0, 1).str("general.alignment").u32(uint32(Uint32)).u32(48).data(16).Bytes()
	}, "general.alignment: 48 of type uint32 (allowed: a uint32 power of two"},
	{"alignment of another type", func() []byte {
		return new(bld).head(3, 0, 1).str("general.alignment").u32(uint32(Uint64)).u64(32).data(16).Bytes()
	}, "general.alignment: 32 of type uint64"},
	{"no dims", func() []byte { return new(bld).head(3, 1, 0).tensor("t", nil, 0, 0).data(128).Bytes() }, "tensor t n_dims: 0 dimensions (allowed: 1..4)"},
	{"five dims", func() []byte {
		return new(bld).head(3, 1, 0).tensor("t", []uint64{1, 1, 1, 1, 1}, 0, 0).data(128).Bytes()
	}, "tensor t n_dims: 5 dimensions"},
	{"zero dim", func() []byte { return new(bld).head(3, 1, 0).tensor("t", []uint64{32, 0}, 0, 0).data(128).Bytes() }, "tensor t dim 1: 0 (allowed: at least 1"},
	{"dims overflowing", func() []byte {
		return new(bld).head(3, 1, 0).tensor("t", []uint64{1 << 40, 1 << 40}, 0, 0).data(128).Bytes()
	}, "tensor t dim 0: 1099511627776"},
	{"unknown tensor type", func() []byte { return new(bld).head(3, 1, 0).tensor("t", []uint64{32}, 99, 0).data(128).Bytes() }, "tensor t type: 99 is not a ggml tensor type"},
	{"retired tensor type", func() []byte { return new(bld).head(3, 1, 0).tensor("t", []uint64{32}, 4, 0).data(128).Bytes() }, "tensor t type: 4 is not a ggml tensor type"},
	{"row not whole blocks", func() []byte { return new(bld).head(3, 1, 0).tensor("t", []uint64{40}, 8, 0).data(128).Bytes() }, "a row of 40 values of type q8_0, not a multiple of its block of 32"},
	{"misaligned offset", func() []byte { return new(bld).head(3, 1, 0).tensor("t", []uint64{8}, 0, 4).data(128).Bytes() }, "tensor t offset: 4 is not a multiple of the alignment 32"},
	{"offset past the end", func() []byte {
		return new(bld).head(3, 1, 0).tensor("t", []uint64{8}, 0, 1<<40).data(128).Bytes()
	}, "tensor t offset: 1099511627776 is past the end"},
	{"data past the end", func() []byte { return new(bld).head(3, 1, 0).tensor("t", []uint64{64}, 0, 0).data(128).Bytes() }, "tensor t data: 256 bytes at data offset 0 end at byte"},
	{"overlap", func() []byte {
		return new(bld).head(3, 2, 0).tensor("a", []uint64{16}, 0, 0).tensor("b", []uint64{16}, 0, 32).data(256).Bytes()
	}, "overlap tensor a's"},
	{"duplicate tensor", func() []byte {
		return new(bld).head(3, 2, 0).tensor("a", []uint64{8}, 0, 0).tensor("a", []uint64{8}, 0, 32).data(256).Bytes()
	}, `tensor "a" appears twice`},
	{"tensor name past the end", func() []byte { return new(bld).head(3, 1, 0).u64(1000).data(40).Bytes() }, "tensor 0 name: a string of 1000 bytes runs past the end"},
	{"truncated tensor info", func() []byte {
		b := new(bld).head(3, 2, 0).tensor("t", []uint64{8}, 0, 0).tensor(strings.Repeat("u", 60), []uint64{8}, 0, 32).Bytes()
		return b[:len(b)-4]
	}, "offset: a value of 8 bytes runs past the end of the file"},
}

// TestHostileHeaders: each bad header is refused with a FormatError (which
// matches ErrFormat) naming the field and the problem; nothing panics or
// allocates what the header claims.
func TestHostileHeaders(t *testing.T) {
	for _, c := range hostile {
		t.Run(c.name, func(t *testing.T) {
			b := c.file()
			f, err := Read(bytes.NewReader(b), int64(len(b)), "bad.gguf")
			if err == nil {
				t.Fatalf("read %d tensors, want an error holding %q", len(f.Tensors), c.want)
			}
			var fe *FormatError
			if !errors.As(err, &fe) || !errors.Is(err, ErrFormat) {
				t.Fatalf("error %v (%T) is not a FormatError matching ErrFormat", err, err)
			}
			if !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), "bad.gguf") {
				t.Fatalf("error %q, want it to name the file and hold %q", err, c.want)
			}
		})
	}
}

// TestGoodHeader: the builder's well-formed file (the table's base) reads.
func TestGoodHeader(t *testing.T) {
	b := new(bld).head(2, 2, 2).str("general.alignment").u32(uint32(Uint32)).u32(64).
		str("a.list").u32(uint32(Array)).u32(uint32(String)).u64(2).str("x").str("yy").
		tensor("a", []uint64{16}, 0, 0).tensor("b", []uint64{64, 2}, 8, 64)
	for b.Len()%64 != 0 {
		b.WriteByte(0)
	}
	b.Write(make([]byte, 64+4*34))
	f, err := Read(bytes.NewReader(b.Bytes()), int64(b.Len()), "good.gguf")
	if err != nil {
		t.Fatal(err)
	}
	if f.Version != 2 || f.Alignment != 64 || f.DataOffset%64 != 0 || len(f.Tensors) != 2 {
		t.Fatalf("version %d alignment %d data offset %d tensors %d", f.Version, f.Alignment, f.DataOffset, len(f.Tensors))
	}
	if s, _ := f.KV[1].Value.Strings(); len(s) != 2 || s[1] != "yy" {
		t.Fatalf("a.list = %v", f.KV[1].Value)
	}
	tb, _ := f.Tensor("b")
	if tb.Offset != f.DataOffset+64 || tb.Bytes != 136 || tb.Type != Q8_0 || tb.Shape()[0] != 2 || tb.Shape()[1] != 64 {
		t.Fatalf("tensor b %+v", *tb)
	}
}

// FuzzReadHeader: whatever the bytes, Read returns a File whose tensors
// lie inside the file, or an error matching ErrFormat; reading the
// tensors, the model and the tokenizer of an accepted file never panics.
func FuzzReadHeader(f *testing.F) {
	for _, c := range hostile {
		f.Add(c.file())
	}
	w := NewWriter()
	w.Set("general.architecture", "llama")
	w.Set("a.floats", []float32{1, 2})
	w.SetByteVocab(300)
	w.AddTensor("t", F32, []int{2, 8}, make([]byte, 64))
	w.AddTensor("q", Q4_0, []int{1, 32}, make([]byte, 18))
	var buf bytes.Buffer
	w.WriteTo(&buf)
	f.Add(buf.Bytes())
	f.Fuzz(func(t *testing.T, b []byte) {
		file, err := Read(bytes.NewReader(b), int64(len(b)), "fuzz.gguf")
		if err != nil {
			if !errors.Is(err, ErrFormat) {
				t.Fatalf("error %v does not match ErrFormat", err)
			}
			return
		}
		for i := range file.Tensors {
			ti := &file.Tensors[i]
			if ti.Offset < file.DataOffset || ti.Offset+ti.Bytes > int64(len(b)) || ti.Offset%file.Alignment != 0 {
				t.Fatalf("tensor %s at %d+%d outside the %d-byte file", ti.Name, ti.Offset, ti.Bytes, len(b))
			}
			if _, err := file.Data(ti.Name); err != nil && !errors.Is(err, ErrUnsupported) {
				t.Fatalf("tensor %s: %v", ti.Name, err)
			}
		}
		file.Model()
		file.Tokenizer()
	})
}

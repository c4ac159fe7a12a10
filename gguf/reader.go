package gguf

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"math/bits"
	"os"
	"sort"
	"unicode/utf8"

	"github.com/zinfio/zinf/decoder/kernels"
)

// Bounds on what a header may ask the reader to hold. Each count or length
// read from a file is checked against them and against the bytes left in
// the file before anything is allocated for it: a real model has a few
// thousand tensors, a few dozen metadata keys and a token list of up to a
// few hundred thousand strings.
const (
	// MaxTensors bounds the tensor count.
	MaxTensors = 1 << 20
	// MaxKV bounds the metadata key count.
	MaxKV = 1 << 20
	// MaxKeyBytes bounds a metadata key; MaxNameBytes a tensor name.
	MaxKeyBytes  = 1 << 16
	MaxNameBytes = 1 << 12
	// MaxStringBytes bounds one metadata string (a chat template is tens
	// of KB).
	MaxStringBytes = 64 << 20
	// MaxArrayLen bounds one metadata array's length.
	MaxArrayLen = 1 << 28
	// MaxHeaderMemory bounds the memory the metadata and the tensor infos
	// take once read (Go string and slice headers counted), whatever the
	// file's size.
	MaxHeaderMemory = 1 << 30
	// MaxDims is ggml's GGML_MAX_DIMS.
	MaxDims = 4
	// MaxAlignment bounds general.alignment (a page, or a huge page, is
	// the most a mapping wants).
	MaxAlignment = 1 << 21
	// DefaultAlignment is the alignment of the data when general.alignment
	// is absent.
	DefaultAlignment = 32
)

// magic is "GGUF" as the file's first four bytes.
const magic = "GGUF"

// ErrFormat is what every error about a file's contents matches
// (errors.Is): the file is not a GGUF file this package reads.
var ErrFormat = errors.New("gguf: not a valid GGUF file")

// ErrUnsupported is matched by the error for a tensor whose type the
// package does not hand out (Data, ReadData).
var ErrUnsupported = errors.New("gguf: unsupported tensor type")

// FormatError is an error in a file's header: the file, the byte offset
// where the bad field starts, the field and what is wrong (the value and
// what is allowed). It matches ErrFormat.
type FormatError struct {
	File   string
	Offset int64
	Field  string
	Msg    string
}

func (e *FormatError) Error() string {
	return fmt.Sprintf("gguf: %s: at byte %d: %s: %s", e.File, e.Offset, e.Field, e.Msg)
}

// Is makes a FormatError match ErrFormat.
func (e *FormatError) Is(target error) bool { return target == ErrFormat }

// KV is one metadata entry.
type KV struct {
	Key   string
	Value Value
}

// TensorInfo describes one tensor of a file.
type TensorInfo struct {
	Name string
	// Dims are ggml's dimensions, fastest first: Dims[0] values make a
	// row (for a weight matrix, its in features), Dims[1] rows (its out
	// features). Shape gives them row-major.
	Dims []uint64
	Type Type
	// Offset is where the tensor's data starts in the file (absolute:
	// the data section's start plus the offset the header gives), Bytes
	// its length.
	Offset, Bytes int64
}

// Shape returns the dimensions row-major (slowest first), as Go code and
// decoder.Config.Shape index them: a weight matrix is out x in.
func (t *TensorInfo) Shape() []int {
	s := make([]int, len(t.Dims))
	for i, d := range t.Dims {
		s[len(s)-1-i] = int(d)
	}
	return s
}

// Elements returns the number of values.
func (t *TensorInfo) Elements() int64 {
	n := int64(1)
	for _, d := range t.Dims {
		n *= int64(d)
	}
	return n
}

// File is a GGUF file's header, read and checked, and the means to read
// each tensor's data where it lies: nothing but the header is read until
// a caller asks for a tensor (Section, ReadData, Data). Its methods are
// safe for concurrent use after Read returns, as the io.ReaderAt under it
// is.
type File struct {
	// Name is the file's name in errors.
	Name string
	// Version is the format version (2 or 3).
	Version uint32
	// KV is the metadata in file order.
	KV []KV
	// Tensors are the tensor infos in file order.
	Tensors []TensorInfo
	// Alignment is general.alignment (DefaultAlignment when absent);
	// DataOffset is where the data section starts; Size is the file's
	// size.
	Alignment, DataOffset, Size int64

	r      io.ReaderAt
	closer io.Closer
	keys   map[string]int
	names  map[string]int
}

// Open opens and reads the GGUF file at path. Close closes it.
func Open(path string) (*File, error) {
	fd, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("gguf: %w", err)
	}
	st, err := fd.Stat()
	if err != nil {
		fd.Close()
		return nil, fmt.Errorf("gguf: %w", err)
	}
	f, err := Read(fd, st.Size(), path)
	if err != nil {
		fd.Close()
		return nil, err
	}
	f.closer = fd
	return f, nil
}

// Close closes the file Open opened (nothing for a File from Read).
func (f *File) Close() error {
	if f.closer == nil {
		return nil
	}
	c := f.closer
	f.closer = nil
	return c.Close()
}

// Read reads and checks the header of the GGUF file r of size bytes (name
// names it in errors). Every count, length and offset is bounded by the
// file's size and this package's limits before it is used; each tensor's
// data must lie inside the file, aligned, and no two tensors may overlap.
func Read(r io.ReaderAt, size int64, name string) (*File, error) {
	if size < 0 {
		return nil, fmt.Errorf("gguf: %s: size %d is negative", name, size)
	}
	h := &hdr{r: bufio.NewReaderSize(io.NewSectionReader(r, 0, size), 64<<10), size: size, name: name, budget: MaxHeaderMemory}
	f := &File{Name: name, Size: size, r: r, keys: map[string]int{}, names: map[string]int{}}
	if err := h.header(f); err != nil {
		return nil, err
	}
	return f, nil
}

// hdr reads a header as a stream, tracking the offset for errors and the
// bytes left for bounds.
type hdr struct {
	r      *bufio.Reader
	pos    int64
	size   int64
	name   string
	field  string // the field being read, for errors
	start  int64  // where it started
	budget int64  // memory the header may still take
	buf    [8]byte
}

func (h *hdr) fail(format string, a ...any) error {
	return &FormatError{File: h.name, Offset: h.start, Field: h.field, Msg: fmt.Sprintf(format, a...)}
}

// at names the field read next.
func (h *hdr) at(field string) { h.field, h.start = field, h.pos }

func (h *hdr) left() int64 { return h.size - h.pos }

// need checks that n bytes are left in the file.
func (h *hdr) need(n uint64, what string) error {
	if n > uint64(h.left()) {
		return h.fail("%s of %d bytes runs past the end of the file (%d bytes left of %d)", what, n, h.left(), h.size)
	}
	return nil
}

// spend takes n bytes from the memory budget.
func (h *hdr) spend(n uint64) error {
	if n > uint64(h.budget) {
		return h.fail("the header would take more than %d bytes of memory (MaxHeaderMemory)", int64(MaxHeaderMemory))
	}
	h.budget -= int64(n)
	return nil
}

func (h *hdr) read(p []byte) error {
	if err := h.need(uint64(len(p)), "a value"); err != nil {
		return err
	}
	n, err := io.ReadFull(h.r, p)
	h.pos += int64(n)
	if err != nil {
		if errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) {
			return h.fail("the file ends early (%d bytes, %d read)", h.size, h.pos)
		}
		return fmt.Errorf("gguf: %s: reading at byte %d: %w", h.name, h.pos, err)
	}
	return nil
}

func (h *hdr) u8() (uint8, error) {
	err := h.read(h.buf[:1])
	return h.buf[0], err
}

func (h *hdr) u16() (uint16, error) {
	err := h.read(h.buf[:2])
	return binary.LittleEndian.Uint16(h.buf[:2]), err
}

func (h *hdr) u32() (uint32, error) {
	err := h.read(h.buf[:4])
	return binary.LittleEndian.Uint32(h.buf[:4]), err
}

func (h *hdr) u64() (uint64, error) {
	err := h.read(h.buf[:8])
	return binary.LittleEndian.Uint64(h.buf[:8]), err
}

// str reads a string (a uint64 length, then its bytes) of at most max
// bytes.
func (h *hdr) str(max int) (string, error) {
	n, err := h.u64()
	if err != nil {
		return "", err
	}
	if n > uint64(max) {
		return "", h.fail("a string of %d bytes is above the limit of %d", n, max)
	}
	if err := h.need(n, "a string"); err != nil {
		return "", err
	}
	if err := h.spend(16 + n); err != nil {
		return "", err
	}
	b := make([]byte, n)
	if err := h.read(b); err != nil {
		return "", err
	}
	return string(b), nil
}

func (h *hdr) header(f *File) error {
	h.at("magic")
	var m [4]byte
	if err := h.read(m[:]); err != nil {
		return err
	}
	if string(m[:]) != magic {
		return h.fail("%q, want %q (not a GGUF file)", m[:], magic)
	}
	h.at("version")
	v, err := h.u32()
	if err != nil {
		return err
	}
	switch {
	case v == 2 || v == 3:
	case v == 1:
		return h.fail("1 (the first version's 32-bit counts are not read; allowed: 2, 3)")
	case v&0xffff == 0 && bits.ReverseBytes32(v) <= 3:
		return h.fail("%d reads as %d byte-swapped: a big-endian file (allowed: little-endian versions 2, 3)", v, bits.ReverseBytes32(v))
	default:
		return h.fail("%d (allowed: 2, 3)", v)
	}
	f.Version = v
	h.at("tensor_count")
	nt, err := h.u64()
	if err != nil {
		return err
	}
	// A tensor info takes at least 8 (name length) + 1 (name) + 4 (dims)
	// + 8 (one dim) + 4 (type) + 8 (offset) bytes.
	if nt > MaxTensors || nt > uint64(h.left())/33 {
		return h.fail("%d tensors (allowed: up to %d, and at most one per 33 bytes of the %d bytes left)", nt, MaxTensors, h.left())
	}
	h.at("metadata_kv_count")
	nkv, err := h.u64()
	if err != nil {
		return err
	}
	// A key-value takes at least 8 (key length) + 4 (type) + 1 bytes.
	if nkv > MaxKV || nkv > uint64(h.left())/13 {
		return h.fail("%d metadata entries (allowed: up to %d, and at most one per 13 bytes of the %d bytes left)", nkv, MaxKV, h.left())
	}
	f.KV = make([]KV, 0, nkv)
	for i := range nkv {
		h.at(fmt.Sprintf("metadata %d key", i))
		key, err := h.str(MaxKeyBytes)
		if err != nil {
			return err
		}
		if key == "" || !utf8.ValidString(key) {
			return h.fail("key %q (allowed: a non-empty UTF-8 string)", key)
		}
		if _, dup := f.keys[key]; dup {
			return h.fail("key %q appears twice", key)
		}
		h.at("metadata " + key)
		val, err := h.value()
		if err != nil {
			return err
		}
		f.keys[key] = len(f.KV)
		f.KV = append(f.KV, KV{key, val})
	}
	f.Alignment = DefaultAlignment
	if v, ok := f.Get("general.alignment"); ok {
		a, isInt := v.Int()
		if v.Type != Uint32 || !isInt || a < 1 || a > MaxAlignment || a&(a-1) != 0 {
			return &FormatError{File: h.name, Offset: h.pos, Field: "general.alignment", Msg: fmt.Sprintf("%v of type %v (allowed: a uint32 power of two, 1..%d)", v, v.Type, MaxAlignment)}
		}
		f.Alignment = a
	}
	f.Tensors = make([]TensorInfo, 0, nt)
	if err := h.spend(nt * 64); err != nil {
		return err
	}
	rel := make([]uint64, nt)
	for i := range nt {
		h.at(fmt.Sprintf("tensor %d name", i))
		name, err := h.str(MaxNameBytes)
		if err != nil {
			return err
		}
		if name == "" || !utf8.ValidString(name) {
			return h.fail("name %q (allowed: a non-empty UTF-8 string)", name)
		}
		if _, dup := f.names[name]; dup {
			return h.fail("tensor %q appears twice", name)
		}
		ti := TensorInfo{Name: name}
		h.at("tensor " + name + " n_dims")
		nd, err := h.u32()
		if err != nil {
			return err
		}
		if nd < 1 || nd > MaxDims {
			return h.fail("%d dimensions (allowed: 1..%d)", nd, MaxDims)
		}
		ti.Dims = make([]uint64, nd)
		elems := uint64(1)
		for d := range ti.Dims {
			h.at(fmt.Sprintf("tensor %s dim %d", name, d))
			n, err := h.u64()
			if err != nil {
				return err
			}
			// No tensor has more values than the file has bits; an empty
			// dimension has no use in a model.
			hi, lo := bits.Mul64(elems, n)
			if n < 1 || hi != 0 || lo > uint64(h.size)*8 {
				return h.fail("%d (allowed: at least 1, and the tensor's values at most 8 per byte of the %d-byte file)", n, h.size)
			}
			ti.Dims[d], elems = n, lo
		}
		h.at("tensor " + name + " type")
		t, err := h.u32()
		if err != nil {
			return err
		}
		ti.Type = Type(t)
		info, ok := types[ti.Type]
		if !ok {
			return h.fail("%d is not a ggml tensor type this reader knows (its size cannot be computed)", t)
		}
		if ti.Dims[0]%uint64(info.blockElems) != 0 {
			return h.fail("a row of %d values of type %v, not a multiple of its block of %d", ti.Dims[0], ti.Type, info.blockElems)
		}
		ti.Bytes = int64(elems / uint64(info.blockElems) * uint64(info.blockBytes))
		h.at("tensor " + name + " offset")
		off, err := h.u64()
		if err != nil {
			return err
		}
		if off%uint64(f.Alignment) != 0 {
			return h.fail("%d is not a multiple of the alignment %d", off, f.Alignment)
		}
		if off > uint64(h.size) {
			return h.fail("%d is past the end of the %d-byte file", off, h.size)
		}
		rel[i] = off
		f.names[name] = len(f.Tensors)
		f.Tensors = append(f.Tensors, ti)
	}
	f.DataOffset = (h.pos + f.Alignment - 1) / f.Alignment * f.Alignment
	if nt > 0 && f.DataOffset > h.size {
		h.at("data section")
		return h.fail("starts at byte %d (the header's end %d aligned to %d), past the end of the %d-byte file", f.DataOffset, h.pos, f.Alignment, h.size)
	}
	for i := range f.Tensors {
		t := &f.Tensors[i]
		end := uint64(f.DataOffset) + rel[i] + uint64(t.Bytes)
		if end > uint64(h.size) || end < rel[i] {
			return &FormatError{File: h.name, Offset: f.DataOffset, Field: "tensor " + t.Name + " data",
				Msg: fmt.Sprintf("%d bytes at data offset %d end at byte %d, past the end of the %d-byte file", t.Bytes, rel[i], end, h.size)}
		}
		t.Offset = f.DataOffset + int64(rel[i])
	}
	order := make([]int, len(f.Tensors))
	for i := range order {
		order[i] = i
	}
	sort.Slice(order, func(a, b int) bool {
		ta, tb := &f.Tensors[order[a]], &f.Tensors[order[b]]
		if ta.Offset != tb.Offset {
			return ta.Offset < tb.Offset
		}
		return ta.Name < tb.Name
	})
	for i := 1; i < len(order); i++ {
		a, b := &f.Tensors[order[i-1]], &f.Tensors[order[i]]
		if a.Offset+a.Bytes > b.Offset && a.Bytes > 0 && b.Bytes > 0 {
			return &FormatError{File: h.name, Offset: f.DataOffset, Field: "tensor " + b.Name + " data",
				Msg: fmt.Sprintf("bytes %d..%d overlap tensor %s's %d..%d", b.Offset, b.Offset+b.Bytes, a.Name, a.Offset, a.Offset+a.Bytes)}
		}
	}
	return nil
}

// value reads a metadata value: its type, then the value.
func (h *hdr) value() (Value, error) {
	t, err := h.u32()
	if err != nil {
		return Value{}, err
	}
	vt := ValueType(t)
	if vt >= numValueTypes {
		return Value{}, h.fail("value type %d (allowed: 0..%d)", t, numValueTypes-1)
	}
	if vt != Array {
		x, err := h.scalar(vt)
		return Value{Type: vt, v: x}, err
	}
	et, err := h.u32()
	if err != nil {
		return Value{}, err
	}
	elem := ValueType(et)
	if elem >= numValueTypes || elem == Array {
		return Value{}, h.fail("array of value type %d (allowed: the scalar types 0..%d except %d, array)", et, numValueTypes-1, Array)
	}
	n, err := h.u64()
	if err != nil {
		return Value{}, err
	}
	min := uint64(elem.size())
	if elem == String {
		min = 8
	}
	if n > MaxArrayLen || n > uint64(h.left())/min {
		return Value{}, h.fail("an array of %d %v values (allowed: up to %d, and at most one per %d bytes of the %d bytes left)", n, elem, MaxArrayLen, min, h.left())
	}
	if err := h.spend(n * max(min, 16)); err != nil {
		return Value{}, err
	}
	v := Value{Type: Array, Elem: elem}
	switch elem {
	case String:
		a := make([]string, n)
		for i := range a {
			if a[i], err = h.str(MaxStringBytes); err != nil {
				return Value{}, err
			}
		}
		v.v = a
	case Bool:
		a := make([]bool, n)
		for i := range a {
			b, err := h.u8()
			if err != nil {
				return Value{}, err
			}
			if b > 1 {
				return Value{}, h.fail("bool %d at element %d (allowed: 0, 1)", b, i)
			}
			a[i] = b == 1
		}
		v.v = a
	default:
		raw := make([]byte, n*min)
		if err := h.read(raw); err != nil {
			return Value{}, err
		}
		v.v = decodeArray(elem, raw, int(n))
	}
	return v, nil
}

// decodeArray converts n little-endian values of the fixed-size type t.
func decodeArray(t ValueType, b []byte, n int) any {
	le := binary.LittleEndian
	switch t {
	case Uint8:
		return b
	case Int8:
		a := make([]int8, n)
		for i := range a {
			a[i] = int8(b[i])
		}
		return a
	case Uint16:
		a := make([]uint16, n)
		for i := range a {
			a[i] = le.Uint16(b[2*i:])
		}
		return a
	case Int16:
		a := make([]int16, n)
		for i := range a {
			a[i] = int16(le.Uint16(b[2*i:]))
		}
		return a
	case Uint32:
		a := make([]uint32, n)
		for i := range a {
			a[i] = le.Uint32(b[4*i:])
		}
		return a
	case Int32:
		a := make([]int32, n)
		for i := range a {
			a[i] = int32(le.Uint32(b[4*i:]))
		}
		return a
	case Float32:
		a := make([]float32, n)
		for i := range a {
			a[i] = math.Float32frombits(le.Uint32(b[4*i:]))
		}
		return a
	case Uint64:
		a := make([]uint64, n)
		for i := range a {
			a[i] = le.Uint64(b[8*i:])
		}
		return a
	case Int64:
		a := make([]int64, n)
		for i := range a {
			a[i] = int64(le.Uint64(b[8*i:]))
		}
		return a
	case Float64:
		a := make([]float64, n)
		for i := range a {
			a[i] = math.Float64frombits(le.Uint64(b[8*i:]))
		}
		return a
	}
	return nil
}

// scalar reads one value of a scalar type.
func (h *hdr) scalar(t ValueType) (any, error) {
	switch t {
	case Uint8:
		return h.u8()
	case Int8:
		b, err := h.u8()
		return int8(b), err
	case Uint16:
		return h.u16()
	case Int16:
		b, err := h.u16()
		return int16(b), err
	case Uint32:
		return h.u32()
	case Int32:
		b, err := h.u32()
		return int32(b), err
	case Float32:
		b, err := h.u32()
		return math.Float32frombits(b), err
	case Bool:
		b, err := h.u8()
		if err == nil && b > 1 {
			return nil, h.fail("bool %d (allowed: 0, 1)", b)
		}
		return b == 1, err
	case String:
		return h.str(MaxStringBytes)
	case Uint64:
		return h.u64()
	case Int64:
		b, err := h.u64()
		return int64(b), err
	case Float64:
		b, err := h.u64()
		return math.Float64frombits(b), err
	}
	return nil, h.fail("value type %v is not a scalar", t)
}

// Get returns the metadata value of key.
func (f *File) Get(key string) (Value, bool) {
	i, ok := f.keys[key]
	if !ok {
		return Value{}, false
	}
	return f.KV[i].Value, true
}

// Tensor returns the info of the tensor name.
func (f *File) Tensor(name string) (*TensorInfo, bool) {
	i, ok := f.names[name]
	if !ok {
		return nil, false
	}
	return &f.Tensors[i], true
}

// Section returns a reader of the tensor's bytes as stored, whatever its
// type: a view of the file, nothing read yet.
func (f *File) Section(t *TensorInfo) *io.SectionReader {
	return io.NewSectionReader(f.r, t.Offset, t.Bytes)
}

// DataBytes returns the bytes ReadData writes for t: its stored bytes,
// twice that for f16 (widened to f32). A type the package does not hand
// out is refused with ErrUnsupported.
func (f *File) DataBytes(t *TensorInfo) (int64, error) {
	if !t.Type.Supported() {
		return 0, fmt.Errorf("%w: %s: tensor %s is %v (allowed: %s)", ErrUnsupported, f.Name, t.Name, t.Type, supportedNames)
	}
	if t.Type == F16 {
		return 2 * t.Bytes, nil
	}
	return t.Bytes, nil
}

// ReadData reads tensor t's values into dst (DataBytes(t) bytes; dst may
// be a pinned buffer or any memory the caller owns) and returns the
// decoder's view of them: f32, bf16, q8_0 and q4_0 as stored, f16 widened
// to f32 (the decoder has no f16 kernel).
func (f *File) ReadData(t *TensorInfo, dst []byte) (Tensor, error) {
	n, err := f.DataBytes(t)
	if err != nil {
		return Tensor{}, err
	}
	if int64(len(dst)) < n {
		return Tensor{}, fmt.Errorf("gguf: %s: tensor %s: a buffer of %d bytes for its %d bytes", f.Name, t.Name, len(dst), n)
	}
	dst = dst[:n]
	raw := dst
	if t.Type == F16 {
		raw = dst[t.Bytes:] // the f16 values in the upper half, widened downwards in place
	}
	if _, err := f.r.ReadAt(raw, t.Offset); err != nil {
		return Tensor{}, fmt.Errorf("gguf: %s: tensor %s: reading %d bytes at byte %d: %w", f.Name, t.Name, len(raw), t.Offset, err)
	}
	if t.Type == F16 {
		for i := range t.Bytes / 2 {
			h := binary.LittleEndian.Uint16(raw[2*i:])
			binary.LittleEndian.PutUint32(dst[4*i:], math.Float32bits(kernels.HalfToFloat32(h)))
		}
		return Tensor{Type: F32, Data: dst}, nil
	}
	return Tensor{Type: t.Type, Data: dst}, nil
}

// Tensor is a tensor's data and the type it is in.
type Tensor struct {
	Type Type
	Data []byte
}

// Data reads the tensor name into new memory (see ReadData).
func (f *File) Data(name string) (Tensor, error) {
	t, ok := f.Tensor(name)
	if !ok {
		return Tensor{}, fmt.Errorf("gguf: %s: no tensor %q", f.Name, name)
	}
	n, err := f.DataBytes(t)
	if err != nil {
		return Tensor{}, err
	}
	return f.ReadData(t, make([]byte, n))
}

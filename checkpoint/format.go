package checkpoint

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"time"

	"github.com/zinfio/zinf/internal/base/crc32c"
	"github.com/zinfio/zinf/swapper"
	"github.com/zinfio/zinf/tensor"
)

// FormatName is the "format" field of every zinf checkpoint.json and
// manifest.json; a directory whose checkpoint.json says anything else is not
// a zinf checkpoint.
const FormatName = "zinf-checkpoint"

// FormatVersion is the format version this build writes and reads. It
// changes only when an older reader could misread a newer checkpoint.
const FormatVersion = 1

// maxHeaderBytes bounds a safetensors header's JSON, as the safetensors
// library does (100 MB), so a corrupt length cannot make a reader allocate
// the disk. Every header length read from a file (the 8-byte prefix, a
// manifest's header_bytes) is held against it before anything is
// allocated.
const maxHeaderBytes = 100 << 20

// maxManifestBytes bounds manifest.json and checkpoint.json for the same
// reason. Decoding JSON costs a small multiple of its size in memory, so
// the bound is what a reader may spend, not what a disk may hold: 64 MiB
// is some 250,000 tensors per rank, and the writer refuses to write more.
const maxManifestBytes = 64 << 20

// Manifest is a committed checkpoint's index, stored as checkpoint.json in
// the checkpoint directory. It names the ranks; each rank's own manifest
// (RankManifest, rank-NNNNN/manifest.json) lists its files and tensors.
type Manifest struct {
	Format     string             `json:"format"`
	Version    int                `json:"version"`
	Name       string             `json:"name"`
	Step       int64              `json:"step"`
	WorldSize  int                `json:"world_size"`
	Created    time.Time          `json:"created"`
	Config     json.RawMessage    `json:"config,omitempty"`
	ModelShape map[string][]int64 `json:"model_shape,omitempty"`
	User       map[string]string  `json:"user,omitempty"`
	Ranks      []RankEntry        `json:"ranks"`

	// Dir is the checkpoint directory (not stored).
	Dir string `json:"-"`
	// RankManifests are the ranks' manifests, in rank order, as written by
	// Save (not stored in checkpoint.json; nil when read by ReadManifest).
	RankManifests []*RankManifest `json:"-"`
}

// RankEntry is one rank in checkpoint.json.
type RankEntry struct {
	Rank int `json:"rank"`
	// Dir is the rank's directory relative to the checkpoint ("rank-00000").
	Dir string `json:"dir"`
	// ManifestBytes and ManifestCRC32C identify the rank's manifest.json, so
	// a manifest from another checkpoint or a damaged one is caught.
	ManifestBytes  int64  `json:"manifest_bytes"`
	ManifestCRC32C uint32 `json:"manifest_crc32c"`
	Files          int    `json:"files"`
	Tensors        int    `json:"tensors"`
	TensorBytes    int64  `json:"tensor_bytes"`
}

// RankManifest is one rank's manifest.json: self-describing (it repeats the
// checkpoint's metadata) and complete (every file with its size and header
// checksum, every tensor with its place and checksum).
type RankManifest struct {
	Format     string             `json:"format"`
	Version    int                `json:"version"`
	Name       string             `json:"name"`
	Step       int64              `json:"step"`
	Rank       int                `json:"rank"`
	WorldSize  int                `json:"world_size"`
	Created    time.Time          `json:"created"`
	Config     json.RawMessage    `json:"config,omitempty"`
	ModelShape map[string][]int64 `json:"model_shape,omitempty"`
	User       map[string]string  `json:"user,omitempty"`
	Files      []FileEntry        `json:"files"`
	Tensors    []TensorEntry      `json:"tensors"`
}

// FileEntry is one safetensors file of a rank.
type FileEntry struct {
	Name string `json:"name"`
	// Bytes is the file's exact length.
	Bytes int64 `json:"bytes"`
	// HeaderBytes is the length of the 8-byte size prefix plus the JSON
	// header: the offset where tensor data begins.
	HeaderBytes int64 `json:"header_bytes"`
	// HeaderCRC32C is the CRC-32C (Castagnoli) of bytes [0, HeaderBytes).
	HeaderCRC32C uint32 `json:"header_crc32c"`
}

// TensorEntry is one tensor of a rank.
type TensorEntry struct {
	Name  string  `json:"name"`
	File  string  `json:"file"`
	DType string  `json:"dtype"` // safetensors spelling: F32, BF16, F16
	Shape []int64 `json:"shape"`
	// Offset is the absolute file offset of the tensor's first byte.
	Offset int64 `json:"offset"`
	Bytes  int64 `json:"bytes"`
	// CRC32C is the CRC-32C (Castagnoli) of the tensor's bytes.
	CRC32C uint32 `json:"crc32c"`
}

// TensorInfo describes one saved tensor (Reader.Tensor).
type TensorInfo struct {
	Name  string
	File  string // base name of its safetensors file
	DType swapper.DType
	Shape []int64
	// Offset is the absolute offset of the tensor's data in File.
	Offset int64
	Bytes  int64
	CRC32C uint32
}

// rankDirName is the directory of rank r inside a checkpoint.
func rankDirName(r int) string { return fmt.Sprintf("rank-%05d", r) }

// ---- safetensors header ----

// headerTensor is one entry of a safetensors header.
type headerTensor struct {
	DType       string   `json:"dtype"`
	Shape       []int64  `json:"shape"`
	DataOffsets [2]int64 `json:"data_offsets"`
}

// encodeHeader returns the file's first bytes: the 8-byte little-endian
// length N, then N bytes of JSON padded with spaces so data starts at a
// multiple of 8. Tensors appear in layout order (offsets relative to the
// start of the data, as the format defines), metadata first.
func encodeHeader(tensors []*plannedTensor, meta map[string]string) ([]byte, error) {
	var js bytes.Buffer
	js.WriteString(`{"__metadata__":`)
	mb, err := json.Marshal(meta) // sorted keys: deterministic
	if err != nil {
		return nil, err
	}
	js.Write(mb)
	var rel int64
	for _, pt := range tensors {
		name, err := json.Marshal(pt.t.Name)
		if err != nil {
			return nil, err
		}
		js.WriteByte(',')
		js.Write(name)
		js.WriteByte(':')
		ht := headerTensor{DType: pt.t.DType.SafetensorsName(), Shape: pt.t.Shape, DataOffsets: [2]int64{rel, rel + pt.t.Bytes}}
		b, err := json.Marshal(ht)
		if err != nil {
			return nil, err
		}
		js.Write(b)
		rel += pt.t.Bytes
	}
	js.WriteByte('}')
	for js.Len()%8 != 0 {
		js.WriteByte(' ')
	}
	if js.Len() > maxHeaderBytes {
		return nil, invalidf("safetensors header of %d bytes exceeds the format's limit of %d (too many tensors in one file)", js.Len(), maxHeaderBytes)
	}
	out := make([]byte, 8+js.Len())
	binary.LittleEndian.PutUint64(out, uint64(js.Len()))
	copy(out[8:], js.Bytes())
	return out, nil
}

// parsedHeader is a decoded safetensors header.
type parsedHeader struct {
	headerBytes int64 // 8 + N
	meta        map[string]string
	tensors     map[string]headerTensor
}

// headerLen decodes and bounds the 8-byte length prefix.
func headerLen(prefix []byte) (int64, error) {
	if len(prefix) < 8 {
		return 0, errors.New("file shorter than the 8-byte safetensors header length")
	}
	n := binary.LittleEndian.Uint64(prefix)
	if n > maxHeaderBytes {
		return 0, fmt.Errorf("safetensors header length %d exceeds the limit of %d", n, maxHeaderBytes)
	}
	return int64(n), nil
}

// parseHeader decodes a safetensors header from b (which holds at least
// 8+N bytes) and checks it is well formed: known dtypes, non-negative
// shapes whose sizes match their offsets, offsets contiguous from 0 without
// overlap.
func parseHeader(b []byte) (*parsedHeader, error) {
	n, err := headerLen(b)
	if err != nil {
		return nil, err
	}
	if int64(len(b)) < 8+n {
		return nil, fmt.Errorf("header says %d bytes but only %d follow", n, len(b)-8)
	}
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(b[8:8+n], &raw); err != nil {
		return nil, fmt.Errorf("safetensors header is not a JSON object: %v", err)
	}
	h := &parsedHeader{headerBytes: 8 + n, tensors: make(map[string]headerTensor, len(raw))}
	type span struct {
		name   string
		lo, hi int64
	}
	var spans []span
	for k, v := range raw {
		if k == "__metadata__" {
			if err := json.Unmarshal(v, &h.meta); err != nil {
				return nil, fmt.Errorf("__metadata__ is not a string map: %v", err)
			}
			continue
		}
		var ht headerTensor
		dec := json.NewDecoder(bytes.NewReader(v))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&ht); err != nil {
			return nil, fmt.Errorf("tensor %q: %v", k, err)
		}
		dt, err := parseDType(ht.DType)
		if err != nil || dt.SafetensorsName() != ht.DType {
			return nil, fmt.Errorf("tensor %q: dtype %q is not one zinf writes (F32, BF16, F16, U8)", k, ht.DType)
		}
		elems, err := numElements(ht.Shape)
		if err != nil {
			return nil, fmt.Errorf("tensor %q: %v", k, err)
		}
		lo, hi := ht.DataOffsets[0], ht.DataOffsets[1]
		if lo < 0 || hi < lo || hi-lo != elems*int64(dt.Size()) {
			return nil, fmt.Errorf("tensor %q: data_offsets [%d, %d] do not hold shape %v of %s", k, lo, hi, ht.Shape, ht.DType)
		}
		h.tensors[k] = ht
		spans = append(spans, span{k, lo, hi})
	}
	sort.Slice(spans, func(i, j int) bool {
		if spans[i].lo != spans[j].lo {
			return spans[i].lo < spans[j].lo
		}
		return spans[i].hi < spans[j].hi
	})
	var end int64
	for _, s := range spans {
		if s.lo != end {
			return nil, fmt.Errorf("tensor %q: data starts at %d, expected %d (gap or overlap)", s.name, s.lo, end)
		}
		end = s.hi
	}
	return h, nil
}

// dataBytes returns the total data length a parsed header describes.
func (h *parsedHeader) dataBytes() int64 {
	var end int64
	for _, t := range h.tensors {
		end = max(end, t.DataOffsets[1])
	}
	return end
}

// ---- manifests on disk ----

// writeJSONFile writes v as indented JSON to path and fsyncs it. It returns
// the bytes written (for the index's checksum of a rank manifest).
func writeJSONFile(path string, v any) ([]byte, error) {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return nil, err
	}
	b = append(b, '\n')
	if len(b) > maxManifestBytes {
		return nil, invalidf("%s would be %d bytes, more than the %d a reader accepts (too many tensors in one rank)", filepath.Base(path), len(b), maxManifestBytes)
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return nil, err
	}
	if _, err := f.Write(b); err != nil {
		f.Close()
		return nil, err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return nil, err
	}
	return b, f.Close()
}

// readSmallFile reads a manifest, refusing absurd sizes.
func readSmallFile(path string) ([]byte, error) {
	// Checked before opening too: opening a FIFO would block.
	if st, err := os.Stat(path); err != nil {
		return nil, err
	} else if !st.Mode().IsRegular() {
		return nil, fmt.Errorf("%s is not a regular file", path)
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if !st.Mode().IsRegular() {
		return nil, fmt.Errorf("%s is not a regular file", path)
	}
	if st.Size() > maxManifestBytes {
		return nil, fmt.Errorf("%s is %d bytes, more than the limit of %d for a manifest", path, st.Size(), maxManifestBytes)
	}
	// Read at most the limit (plus one byte to notice growth), whatever the
	// file's size is by now.
	b, err := io.ReadAll(io.LimitReader(f, maxManifestBytes+1))
	if err != nil {
		return nil, err
	}
	if len(b) > maxManifestBytes {
		return nil, fmt.Errorf("%s grew past the limit of %d bytes for a manifest while being read", path, maxManifestBytes)
	}
	return b, nil
}

// formatProbe is decoded first, to tell foreign files and other versions
// apart before the full decode.
type formatProbe struct {
	Format  string `json:"format"`
	Version int    `json:"version"`
}

// checkFormat classifies a manifest's bytes: ErrCorrupt if it is not JSON
// (zinf wrote a file of that name and it was damaged; a foreign file of
// that name is reported the same way), ErrNotCheckpoint if its format is
// another one, ErrVersion if the version differs.
func checkFormat(b []byte, what string) error {
	var p formatProbe
	if err := json.Unmarshal(b, &p); err != nil {
		return corruptf("%s is not valid JSON: %v", what, err)
	}
	if p.Format != FormatName {
		return fmt.Errorf("%w: %s has format %q, not %q", ErrNotCheckpoint, what, p.Format, FormatName)
	}
	if p.Version != FormatVersion {
		return fmt.Errorf("%w: %s is format version %d; this build reads version %d", ErrVersion, what, p.Version, FormatVersion)
	}
	return nil
}

// ReadManifest reads and checks a committed checkpoint's checkpoint.json
// (format, version, rank list); it does not open the ranks (Open does).
func ReadManifest(dir string) (*Manifest, error) {
	m, err := readIndex(dir)
	if err != nil {
		return nil, &Error{Op: "open", Path: dir, Err: err}
	}
	return m, nil
}

func readIndex(dir string) (*Manifest, error) {
	path := filepath.Join(dir, indexFile)
	b, err := readSmallFile(path)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, missingIndexError(dir)
		}
		return nil, corruptf("reading %s: %v", indexFile, err)
	}
	if err := checkFormat(b, indexFile); err != nil {
		return nil, err
	}
	var m Manifest
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, corruptf("%s: %v", indexFile, err)
	}
	m.Dir = dir
	if m.WorldSize <= 0 || len(m.Ranks) != m.WorldSize {
		return nil, corruptf("%s: world size %d but %d ranks listed", indexFile, m.WorldSize, len(m.Ranks))
	}
	for i, r := range m.Ranks {
		if r.Rank != i || r.Dir != rankDirName(i) {
			return nil, corruptf("%s: rank entry %d is rank %d in %q, expected rank %d in %q", indexFile, i, r.Rank, r.Dir, i, rankDirName(i))
		}
	}
	return &m, nil
}

// missingIndexError says why a directory without checkpoint.json is not a
// checkpoint: an uncommitted or partial one (it has rank directories,
// safetensors files or a manifest) is ErrCorrupt; anything else is
// ErrNotCheckpoint.
func missingIndexError(dir string) error {
	st, err := os.Stat(dir)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("%w: directory does not exist: %w", ErrNotCheckpoint, os.ErrNotExist)
		}
		return fmt.Errorf("%w: %v", ErrNotCheckpoint, err)
	}
	if !st.IsDir() {
		return fmt.Errorf("%w: not a directory", ErrNotCheckpoint)
	}
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		n := e.Name()
		if (e.IsDir() && len(n) == len("rank-00000") && n[:5] == "rank-") ||
			filepath.Ext(n) == ".safetensors" || n == manifestFile {
			return corruptf("%s is missing: the checkpoint was never committed or was damaged (found %s)", indexFile, n)
		}
	}
	if len(entries) == 0 {
		return fmt.Errorf("%w: the directory is empty (no %s)", ErrNotCheckpoint, indexFile)
	}
	return fmt.Errorf("%w: no %s in the directory (%d unrelated entries)", ErrNotCheckpoint, indexFile, len(entries))
}

// readRankManifest reads rank r's manifest and checks it against the
// index entry and itself. It does not touch the tensor files.
func readRankManifest(idx *Manifest, r int) (*RankManifest, error) {
	e := idx.Ranks[r]
	rdir := filepath.Join(idx.Dir, e.Dir)
	path := filepath.Join(rdir, manifestFile)
	b, err := readSmallFile(path)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			if _, derr := os.Stat(rdir); derr != nil {
				return nil, corruptf("rank %d directory %s is missing", r, e.Dir)
			}
			return nil, corruptf("rank %d manifest %s/%s is missing", r, e.Dir, manifestFile)
		}
		return nil, corruptf("reading rank %d manifest: %v", r, err)
	}
	what := e.Dir + "/" + manifestFile
	if err := checkFormat(b, what); err != nil {
		if errors.Is(err, ErrNotCheckpoint) {
			return nil, corruptf("%v", err) // inside a zinf checkpoint: damage, not a foreign dir
		}
		return nil, err
	}
	if int64(len(b)) != e.ManifestBytes || crc32c.Checksum(b) != e.ManifestCRC32C {
		return nil, corruptf("%s: %d bytes with crc32c %08x, but %s recorded %d bytes with crc32c %08x",
			what, len(b), crc32c.Checksum(b), indexFile, e.ManifestBytes, e.ManifestCRC32C)
	}
	var m RankManifest
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, corruptf("%s: %v", what, err)
	}
	if m.Rank != r || m.WorldSize != idx.WorldSize || m.Step != idx.Step || m.Name != idx.Name {
		return nil, corruptf("%s: rank %d of %d at step %d named %q, but %s says rank %d of %d at step %d named %q",
			what, m.Rank, m.WorldSize, m.Step, m.Name, indexFile, r, idx.WorldSize, idx.Step, idx.Name)
	}
	if err := m.check(); err != nil {
		return nil, corruptf("%s: %v", what, err)
	}
	return &m, nil
}

// check verifies a rank manifest is self-consistent: unique names, known
// dtypes, sizes that match shapes, tensors inside their files' data
// regions, contiguous, without overlap.
func (m *RankManifest) check() error {
	files := make(map[string]*FileEntry, len(m.Files))
	for i := range m.Files {
		f := &m.Files[i]
		if err := checkFileName(f.Name); err != nil {
			return err
		}
		if files[f.Name] != nil {
			return fmt.Errorf("file %q listed twice", f.Name)
		}
		if f.HeaderBytes < 8 || f.HeaderBytes > f.Bytes {
			return fmt.Errorf("file %q: header of %d bytes in a file of %d", f.Name, f.HeaderBytes, f.Bytes)
		}
		if f.HeaderBytes > 8+maxHeaderBytes {
			return fmt.Errorf("file %q: header_bytes %d exceeds the safetensors header limit of %d (8 + %d)", f.Name, f.HeaderBytes, 8+maxHeaderBytes, maxHeaderBytes)
		}
		files[f.Name] = f
	}
	ends := make(map[string]int64, len(files))
	for n, f := range files {
		ends[n] = f.HeaderBytes
	}
	seen := make(map[string]bool, len(m.Tensors))
	for _, t := range m.Tensors {
		if seen[t.Name] {
			return fmt.Errorf("tensor %q listed twice", t.Name)
		}
		seen[t.Name] = true
		f := files[t.File]
		if f == nil {
			return fmt.Errorf("tensor %q is in file %q, which is not listed", t.Name, t.File)
		}
		dt, err := parseDType(t.DType)
		if err != nil {
			return fmt.Errorf("tensor %q: %v", t.Name, err)
		}
		elems, err := numElements(t.Shape)
		if err != nil {
			return fmt.Errorf("tensor %q: %v", t.Name, err)
		}
		if t.Bytes != elems*int64(dt.Size()) {
			return fmt.Errorf("tensor %q: %d bytes for shape %v of %s", t.Name, t.Bytes, t.Shape, t.DType)
		}
		if t.Offset != ends[t.File] {
			return fmt.Errorf("tensor %q: offset %d in %q, expected %d (tensors are contiguous in manifest order)", t.Name, t.Offset, t.File, ends[t.File])
		}
		// Offset is within [HeaderBytes, f.Bytes] here, so this cannot
		// overflow, and no sum of sizes can wrap around to look right.
		if t.Bytes > f.Bytes-t.Offset {
			return fmt.Errorf("tensor %q: %d bytes at offset %d run past the end of %q (%d bytes)", t.Name, t.Bytes, t.Offset, t.File, f.Bytes)
		}
		ends[t.File] = t.Offset + t.Bytes
	}
	for n, f := range files {
		if ends[n] != f.Bytes {
			return fmt.Errorf("file %q: tensors end at %d but the file has %d bytes", n, ends[n], f.Bytes)
		}
	}
	return nil
}

// info converts a manifest entry.
func (t *TensorEntry) info() TensorInfo {
	dt, _ := parseDType(t.DType) // checked when the manifest was read
	return TensorInfo{Name: t.Name, File: t.File, DType: dt, Shape: append([]int64{}, t.Shape...), Offset: t.Offset, Bytes: t.Bytes, CRC32C: t.CRC32C}
}

// headerMeta is the __metadata__ of a rank's safetensors files.
func headerMeta(st *State, r *RankState, name string) map[string]string {
	m := map[string]string{
		"format":          "pt", // what transformers' loaders look for
		"zinf.format":     FormatName,
		"zinf.version":    strconv.Itoa(FormatVersion),
		"zinf.name":       name,
		"zinf.step":       strconv.FormatInt(st.Step, 10),
		"zinf.rank":       strconv.Itoa(r.Rank),
		"zinf.world_size": strconv.Itoa(st.world()),
	}
	for k, v := range mergeUser(st.User, r.User) {
		m["user."+k] = v
	}
	return m
}

func mergeUser(a, b map[string]string) map[string]string {
	if len(a) == 0 && len(b) == 0 {
		return nil
	}
	m := make(map[string]string, len(a)+len(b))
	for k, v := range a {
		m[k] = v
	}
	for k, v := range b {
		m[k] = v
	}
	return m
}

// parseDType reads a tensor's dtype as a checkpoint spells it: the
// parameter dtypes (swapper.ParseDType) and "U8", the codes of 8-bit
// optimizer states (tensor.Uint8), which are no parameter dtype.
func parseDType(s string) (swapper.DType, error) {
	if s == "U8" {
		return tensor.Uint8, nil
	}
	return swapper.ParseDType(s)
}

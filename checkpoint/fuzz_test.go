package checkpoint

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	"github.com/zinfio/zinf/aio"
)

// FuzzParseHeader feeds arbitrary bytes to the safetensors header parser:
// it must never panic, and what it accepts must be self-consistent.
func FuzzParseHeader(f *testing.F) {
	add := func(js string) {
		b := binary.LittleEndian.AppendUint64(nil, uint64(len(js)))
		f.Add(append(b, js...))
	}
	add(`{"__metadata__":{"format":"pt"},"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}`)
	add(`{"a":{"dtype":"BF16","shape":[],"data_offsets":[0,2]},"b":{"dtype":"F16","shape":[0,3],"data_offsets":[2,2]}}`)
	add(`{"a":{"dtype":"F64","shape":[1],"data_offsets":[0,8]}}`)
	add(`{"a":{"dtype":"F32","shape":[-1],"data_offsets":[0,8]}}`)
	add(`{"a":{"dtype":"F32","shape":[4611686018427387904,4],"data_offsets":[0,8]}}`)
	add(`[]`)
	f.Add([]byte{255, 255, 255, 255, 255, 255, 255, 255})
	f.Fuzz(func(t *testing.T, b []byte) {
		h, err := parseHeader(b)
		if err != nil {
			return
		}
		var end int64
		for _, ht := range h.tensors {
			if ht.DataOffsets[0] < 0 || ht.DataOffsets[1] < ht.DataOffsets[0] {
				t.Fatalf("accepted offsets %v", ht.DataOffsets)
			}
			end += ht.DataOffsets[1] - ht.DataOffsets[0]
		}
		if end != h.dataBytes() {
			t.Fatalf("accepted tensors with gaps or overlaps: %d bytes in spans ending at %d", end, h.dataBytes())
		}
	})
}

// FuzzManifest feeds arbitrary bytes to the manifest format check: it
// must never panic.
func FuzzManifest(f *testing.F) {
	f.Add([]byte(`{"format":"zinf-checkpoint","version":1}`))
	f.Add([]byte(`{"format":"other"}`))
	f.Add([]byte(`not json`))
	f.Add([]byte(`{"files":[{"name":"a.safetensors","bytes":12,"header_bytes":8}],"tensors":[{"name":"t","file":"a.safetensors","dtype":"F32","shape":[1],"offset":8,"bytes":4}]}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		_ = checkFormat(b, "x")
		var m RankManifest
		if json.Unmarshal(b, &m) == nil {
			_ = m.check()
		}
	})
}

// fuzzAllocBound is the most a single FuzzReadCheckpoint input may
// allocate on the Go heap (runtime.MemStats.TotalAlloc delta): a fixed
// allowance for the reader's own structures plus a small multiple of the
// input's size (JSON decoding costs a few times what it decodes). A length
// trusted from a file would blow through it at once.
func fuzzAllocBound(inputBytes int) uint64 { return 1<<20 + 64*uint64(inputBytes) }

// FuzzReadCheckpoint feeds mutated checkpoints to the reader end to end:
// the three files of a one-rank checkpoint (checkpoint.json, the rank's
// manifest.json, its params.safetensors) are written as given, then Open,
// every tensor's ReadTensor, and Verify run on them. Nothing may panic,
// every failure must be one of the package's errors, what Open accepts
// must lie inside the files, and no input may make the reader allocate
// more than fuzzAllocBound. The seeds are real checkpoints written by Save
// (and a few damaged ones); they run as a normal test. Run the fuzzer with
//
//	go test -run=NONE -fuzz=FuzzReadCheckpoint ./checkpoint
func FuzzReadCheckpoint(f *testing.F) {
	eng, err := aio.New(aio.Options{Direct: aio.DirectOptional, IntraOpParallelism: 1})
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { eng.Close() })
	seed := func(seed uint64, sizes []int) (index, manifest, data []byte) {
		rng := rand.New(rand.NewPCG(seed, seed))
		specs := makeSpecs(rng, []string{"params.safetensors"}, sizes)
		dir := filepath.Join(f.TempDir(), "step-000001")
		st := stateOf(1, specs, fromMemory)
		st.ModelShape = map[string][]int64{"w": {2, 2}}
		if _, err := Save(context.Background(), dir, st, SaveOptions{Engine: eng, StagingBytes: 64 << 10}); err != nil {
			f.Fatal(err)
		}
		read := func(rel string) []byte {
			b, err := os.ReadFile(filepath.Join(dir, rel))
			if err != nil {
				f.Fatal(err)
			}
			return b
		}
		return read(indexFile), read(filepath.Join(rankDirName(0), manifestFile)), read(filepath.Join(rankDirName(0), "params.safetensors"))
	}
	for i, sizes := range [][]int{{16, 6, 4}, {4096, 0, 2}, {10000, 4098}} {
		idx, man, data := seed(uint64(i+1), sizes)
		f.Add(idx, man, data)
		// Damaged variants: a flipped data byte, a truncated file, a
		// header length prefix past the limit, an empty manifest.
		flipped := bytes.Clone(data)
		flipped[len(flipped)-1] ^= 0x40
		f.Add(idx, man, flipped)
		f.Add(idx, man, data[:len(data)/2])
		huge := bytes.Clone(data)
		binary.LittleEndian.PutUint64(huge, 1<<40)
		f.Add(idx, man, huge)
		f.Add(idx, []byte{}, data)
	}
	f.Fuzz(func(t *testing.T, index, manifest, data []byte) {
		dir := filepath.Join(t.TempDir(), "step-000001")
		rdir := filepath.Join(dir, rankDirName(0))
		if err := os.MkdirAll(rdir, 0o755); err != nil {
			t.Fatal(err)
		}
		for p, b := range map[string][]byte{
			filepath.Join(dir, indexFile):             index,
			filepath.Join(rdir, manifestFile):         manifest,
			filepath.Join(rdir, "params.safetensors"): data,
		} {
			if err := os.WriteFile(p, b, 0o644); err != nil {
				t.Fatal(err)
			}
		}
		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
		defer cancel()
		opts := ReadOptions{Engine: eng, ChunkBytes: 64 << 10}
		isOurs := func(err error) bool {
			for _, s := range []error{ErrCorrupt, ErrNotCheckpoint, ErrVersion, ErrNotFound} {
				if errors.Is(err, s) {
					return true
				}
			}
			return false
		}
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		r, err := OpenWith(dir, -1, opts)
		if err == nil {
			for _, fe := range r.Manifest().Files {
				if fe.Name == "params.safetensors" && (fe.Bytes != int64(len(data)) || fe.HeaderBytes > fe.Bytes) {
					t.Fatalf("Open accepted file %+v for %d bytes of data", fe, len(data))
				}
			}
			for _, ti := range r.Tensors() {
				if ti.Offset < 0 || ti.Bytes < 0 || ti.Bytes > int64(len(data))-ti.Offset {
					t.Fatalf("Open accepted tensor %q at %d..+%d in %d bytes", ti.Name, ti.Offset, ti.Bytes, len(data))
				}
				if err := r.ReadTensor(ctx, ti.Name, make([]byte, ti.Bytes)); err != nil && !isOurs(err) {
					t.Fatalf("ReadTensor(%q): an error outside the package's kinds: %v", ti.Name, err)
				}
			}
			r.Close()
		} else if !isOurs(err) {
			t.Fatalf("Open: an error outside the package's kinds: %v", err)
		}
		if _, err := verify(ctx, dir, opts); err != nil && !isOurs(err) {
			t.Fatalf("Verify: an error outside the package's kinds: %v", err)
		}
		if ctx.Err() != nil {
			// A read that hangs is a bug too: say where everything is.
			buf := make([]byte, 1<<20)
			t.Fatalf("reading a crafted checkpoint did not finish within its deadline; goroutines:\n%s", buf[:runtime.Stack(buf, true)])
		}
		runtime.ReadMemStats(&after)
		in := len(index) + len(manifest) + len(data)
		if got := after.TotalAlloc - before.TotalAlloc; got > fuzzAllocBound(in) {
			t.Fatalf("reading a %d-byte checkpoint allocated %d bytes (bound %d)", in, got, fuzzAllocBound(in))
		}
	})
}

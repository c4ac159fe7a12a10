package checkpoint

import (
	"encoding/binary"
	"encoding/json"
	"testing"
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

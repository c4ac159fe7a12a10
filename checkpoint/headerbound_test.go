package checkpoint

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// TestInflatedHeaderRefusedUnread: a tensor file whose header was inflated
// with 300,000 zero-size entries (18 MB, under the format's 100 MB; the
// manifest's header length and checksum forged to match) is refused by
// ReadTensor and Verify before it is read or parsed, at a small cost in
// memory: parsing it whole took some 250 MB (800 MiB of RSS for a
// million entries, through zinf-generate --checkpoint).
func TestInflatedHeaderRefusedUnread(t *testing.T) {
	good, specs := goodCheckpoint(t, 29)
	dir := clone(t, good)
	file := specs[0].file
	path := filepath.Join(dir, rankDirName(0), file)
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	n := int64(binary.LittleEndian.Uint64(b))
	js := bytes.TrimRight(b[8:8+n], " ")
	var extra bytes.Buffer
	for i := range 300_000 {
		fmt.Fprintf(&extra, `,"t%07d":{"dtype":"F32","shape":[0],"data_offsets":[0,0]}`, i)
	}
	hdr := append(append(append([]byte{}, js[:len(js)-1]...), extra.Bytes()...), '}')
	for len(hdr)%8 != 0 {
		hdr = append(hdr, ' ')
	}
	out := binary.LittleEndian.AppendUint64(nil, uint64(len(hdr)))
	out = append(append(out, hdr...), b[8+n:]...)
	if err := os.WriteFile(path, out, 0o644); err != nil {
		t.Fatal(err)
	}
	grow := int64(len(out) - len(b))
	editRankManifest(t, dir, func(m *RankManifest) {
		for i := range m.Files {
			if m.Files[i].Name == file {
				m.Files[i].Bytes += grow
				m.Files[i].HeaderBytes += grow
				m.Files[i].HeaderCRC32C = crc32.Checksum(out[:m.Files[i].HeaderBytes], castagnoli)
			}
		}
		for i := range m.Tensors {
			if m.Tensors[i].File == file {
				m.Tensors[i].Offset += grow
			}
		}
	})
	const want = "more than the manifest's"
	r, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	dst := make([]byte, len(specs[0].data))
	runtime.GC()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	err = r.ReadTensor(context.Background(), specs[0].name, dst)
	runtime.ReadMemStats(&after)
	if !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), want) {
		t.Fatalf("ReadTensor: %v, want ErrCorrupt saying %q", err, want)
	}
	if got := after.TotalAlloc - before.TotalAlloc; got > 16<<20 {
		t.Errorf("refusing the header allocated %.1f MiB (bound 16 MiB)", float64(got)/(1<<20))
	}
	if _, verr := Verify(context.Background(), dir); !errors.Is(verr, ErrCorrupt) || !strings.Contains(verr.Error(), want) {
		t.Fatalf("Verify: %v, want ErrCorrupt saying %q", verr, want)
	}
}

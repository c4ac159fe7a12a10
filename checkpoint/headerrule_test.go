package checkpoint

import (
	"bytes"
	"context"
	"errors"
	"hash/crc32"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestHeaderDisagreesWithManifest: a tensor file whose safetensors header
// disagrees with its manifest (here: a tensor renamed in the header, the
// manifest's header checksum forged to match) is refused by ReadTensor,
// which a resume reads through, by the same rule and words as Verify
// (ckpt verify); ReadTensor used to check only the header's checksum and
// accepted it.
func TestHeaderDisagreesWithManifest(t *testing.T) {
	good, specs := goodCheckpoint(t, 23)
	dir := clone(t, good)
	file := specs[0].file
	path := filepath.Join(dir, rankDirName(0), file)
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	old := []byte(`"` + specs[0].name + `"`)
	renamed := []byte(`"x` + specs[0].name[1:] + `"`)
	if !bytes.Contains(b, old) {
		t.Fatalf("%s has no %s in its header", file, old)
	}
	b = bytes.Replace(b, old, renamed, 1)
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
	editRankManifest(t, dir, func(m *RankManifest) {
		for i := range m.Files {
			if m.Files[i].Name == file {
				m.Files[i].HeaderCRC32C = crc32.Checksum(b[:m.Files[i].HeaderBytes], castagnoli)
			}
		}
	})

	const want = "disagrees with the manifest"
	_, verr := Verify(context.Background(), dir)
	if !errors.Is(verr, ErrCorrupt) || !strings.Contains(verr.Error(), want) {
		t.Fatalf("Verify: %v, want ErrCorrupt saying %q", verr, want)
	}
	r, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	for _, s := range specs {
		if s.file != file {
			continue
		}
		err := r.ReadTensor(context.Background(), s.name, make([]byte, len(s.data)))
		if !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), path) {
			t.Fatalf("ReadTensor %s: %v, want ErrCorrupt naming %s and saying %q", s.name, err, path, want)
		}
	}
}

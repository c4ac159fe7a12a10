package checkpoint

import (
	"context"
	"errors"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// flip xors one byte of a file.
func flip(t *testing.T, path string, off int64) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	b := []byte{0}
	if _, err := f.ReadAt(b, off); err != nil {
		t.Fatal(err)
	}
	b[0] ^= 0x5a
	if _, err := f.WriteAt(b, off); err != nil {
		t.Fatal(err)
	}
}

func TestFlippedByte(t *testing.T) {
	seed := uint64(21)
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, seed))
	dir, specs := goodCheckpoint(t, seed)
	r0, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	m := r0.Manifest()
	r0.Close()
	ctx := context.Background()
	for _, fe := range m.Files {
		path := filepath.Join(dir, "rank-00000", fe.Name)
		// Offsets: the length prefix, the JSON, the last header byte, the
		// first and last byte of every tensor, and random ones.
		offs := []int64{0, 3, 8, fe.HeaderBytes / 2, fe.HeaderBytes - 1}
		for _, te := range m.Tensors {
			if te.File == fe.Name && te.Bytes > 0 {
				offs = append(offs, te.Offset, te.Offset+te.Bytes-1)
			}
		}
		for range 4 {
			offs = append(offs, rng.Int64N(fe.Bytes))
		}
		for _, off := range offs {
			// Which tensor holds the byte ("" for the header).
			var victim string
			var other string
			for _, te := range m.Tensors {
				if te.File != fe.Name {
					continue
				}
				if off >= te.Offset && off < te.Offset+te.Bytes {
					victim = te.Name
				} else if te.Bytes > 0 {
					other = te.Name
				}
			}
			flip(t, path, off)
			rep, err := Verify(ctx, dir)
			if !errors.Is(err, ErrCorrupt) || rep.OK() {
				t.Fatalf("file %s offset %d flipped: Verify = %v", fe.Name, off, err)
			}
			p := rep.Problems[0]
			if p.File != fe.Name || p.Tensor != victim {
				t.Fatalf("file %s offset %d (tensor %q) flipped: problem %v", fe.Name, off, victim, rep.Problems)
			}
			if victim != "" && !strings.Contains(err.Error(), victim) {
				t.Fatalf("Verify error does not name tensor %q: %v", victim, err)
			}
			r, err := Open(dir)
			if err != nil {
				t.Fatal(err)
			}
			reads := []string{victim}
			if victim == "" {
				reads = []string{other} // a damaged header condemns every tensor of the file
			}
			for _, name := range reads {
				te, _ := r.Tensor(name)
				err := r.ReadTensor(ctx, name, make([]byte, te.Bytes))
				if !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), name) || !strings.Contains(err.Error(), fe.Name) {
					t.Fatalf("file %s offset %d flipped: ReadTensor(%s) = %v; want ErrCorrupt naming the tensor and the file", fe.Name, off, name, err)
				}
			}
			if victim != "" && other != "" {
				te, _ := r.Tensor(other)
				if err := r.ReadTensor(ctx, other, make([]byte, te.Bytes)); err != nil {
					t.Fatalf("an intact tensor of the damaged file: %v", err)
				}
			}
			r.Close()
			flip(t, path, off) // restore
		}
	}
	if _, err := Verify(ctx, dir); err != nil {
		t.Fatalf("after restoring every byte: %v", err)
	}
	checkReadBack(t, dir, 0, specs)
}

package swapper_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/zinfio/zinf/aio"
	"github.com/zinfio/zinf/internal/test/testenv"
	"github.com/zinfio/zinf/swapper"
)

// TestAdoptAnyOffset: bytes at any offset of a file are read in place
// (Adopt), whatever their offset leaves in the aligned span and wherever
// the file ends: a tensor pushed into the block after its padded span, one
// in the file's last, partial block, one ending exactly at the file's end,
// one smaller than a block inside it. Every read returns the file's bytes
// into a buffer of the store's padded length (what a pool gives), on
// every I/O backend; nothing is written to the swap files and the file
// is left as it was; bytes past the file's end are an error, not a
// refusal to read in place.
func TestAdoptAnyOffset(t *testing.T) {
	for _, backend := range testenv.Backends(t, []string{aio.BackendUring, aio.BackendLibaio, aio.BackendPosix}, aio.Available) {
		t.Run(backend, func(t *testing.T) {
			r := newRig(t, 1, true, backend)
			const size = 5*4096 + 1000 // not a multiple of any alignment
			file := make([]byte, size)
			rng := rand.New(rand.NewPCG(1, 2))
			for i := range file {
				file[i] = byte(rng.Uint32())
			}
			path := filepath.Join(t.TempDir(), "weights.safetensors")
			if err := os.WriteFile(path, file, 0o644); err != nil {
				t.Fatal(err)
			}
			cases := [][2]int64{ // offset, length
				{0, 1}, {0, 4096}, {0, 4097}, {1, 4095}, {1, 4096}, {40, 500}, {4136, 2000},
				{4095, 2}, {4095, 4097}, {11192, 2000}, {8000, 8192 - 40}, {3, size - 3},
				{size - 1000, 1000}, {size - 900, 7}, {size - 1, 1}, {5 * 4096, 1000}, {5*4096 - 10, 20},
				{0, size},
			}
			for i, c := range cases {
				name := fmt.Sprint("t", i)
				if err := r.store.Adopt(name, path, c[0], c[1]); err != nil {
					if errors.Is(err, swapper.ErrNotInPlace) && strings.Contains(err.Error(), "O_DIRECT") {
						t.Skipf("no O_DIRECT here: %v", err)
					}
					t.Fatalf("bytes [%d, %d): %v", c[0], c[0]+c[1], err)
				}
			}
			for pass := range 2 {
				for i, c := range cases {
					got := r.buf(t, int(c[1]), byte(0xEE-pass)).Bytes()[:c[1]]
					if err := r.store.Read(context.Background(), fmt.Sprint("t", i), got); err != nil {
						t.Fatalf("bytes [%d, %d): %v", c[0], c[0]+c[1], err)
					}
					if want := file[c[0] : c[0]+c[1]]; !bytes.Equal(got, want) {
						t.Fatalf("pass %d, bytes [%d, %d) read in place differ from the file's", pass, c[0], c[0]+c[1])
					}
				}
			}
			st := r.store.Stats()
			if st.BytesWritten != 0 || st.Reads != int64(2*len(cases)) {
				t.Fatalf("store: %d bytes written (want 0), %d reads (want %d)", st.BytesWritten, st.Reads, 2*len(cases))
			}
			err := r.store.Adopt("past", path, size-10, 11)
			if err == nil || errors.Is(err, swapper.ErrNotInPlace) || !strings.Contains(err.Error(), "past the end") {
				t.Fatalf("bytes past the file's end: %v", err)
			}
			if after, err := os.ReadFile(path); err != nil || !bytes.Equal(after, file) {
				t.Fatalf("the file read in place changed: %v", err)
			}
		})
	}
}

// TestAdoptRefusesReplacedFile: a store reads a file in place through the
// descriptor it opened first; the few bytes of a tensor that no aligned
// O_DIRECT read covers are read by opening the path again, and that must
// be the same file. A file replaced at its path after a first tensor was
// adopted from it (a checkpoint rewritten beside the run) is refused for
// the next such tensor, instead of giving it bytes of two files; what was
// adopted before still reads the first file's bytes.
func TestAdoptRefusesReplacedFile(t *testing.T) {
	r := newRig(t, 1, true, aio.BackendPosix)
	const size = 2*4096 + 100
	dir := t.TempDir()
	path := filepath.Join(dir, "weights.safetensors")
	old := bytes.Repeat([]byte{1}, size)
	if err := os.WriteFile(path, old, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := r.store.Adopt("a", path, 0, 4096); err != nil {
		if errors.Is(err, swapper.ErrNotInPlace) && strings.Contains(err.Error(), "O_DIRECT") {
			t.Skipf("no O_DIRECT here: %v", err)
		}
		t.Fatal(err)
	}
	next := filepath.Join(dir, "next")
	if err := os.WriteFile(next, bytes.Repeat([]byte{2}, size), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(next, path); err != nil {
		t.Fatal(err)
	}
	// The file's last 100 bytes: past its last whole block, read apart.
	err := r.store.Adopt("tail", path, 2*4096, 100)
	if err == nil || !strings.Contains(err.Error(), "was replaced since it was opened") {
		t.Fatalf("adopting from a replaced file: %v, want a refusal naming it", err)
	}
	got := r.buf(t, 4096, 0xEE).Bytes()[:4096]
	if err := r.store.Read(context.Background(), "a", got); err != nil || !bytes.Equal(got, old[:4096]) {
		t.Fatalf("the tensor adopted before: %v", err)
	}
}

package zgomlx

import (
	"os"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"
)

// TestDropPages: the whole pages of a buffer go back to the kernel (not
// resident, reading zeros) and the partial pages at its ends keep their
// bytes; a buffer under 16 pages is left alone.
func TestDropPages(t *testing.T) {
	page := os.Getpagesize()
	mem := make([]byte, 70*page)
	b := mem[100 : 100+64*page] // not page-aligned
	for i := range b {
		b[i] = byte(i%251) + 1
	}
	if uintptr(unsafe.Pointer(unsafe.SliceData(mem)))%uintptr(page) != 0 {
		t.Fatal("a 70-page allocation that is not page-aligned")
	}
	// resident counts the resident pages of mem[:65 pages], which hold b.
	resident := func([]byte) int {
		span := mem[:65*page]
		vec := make([]byte, 65)
		if _, _, e := unix.Syscall(unix.SYS_MINCORE, uintptr(unsafe.Pointer(unsafe.SliceData(span))), uintptr(len(span)), uintptr(unsafe.Pointer(unsafe.SliceData(vec)))); e != 0 {
			t.Fatal(e)
		}
		n := 0
		for _, v := range vec {
			n += int(v & 1)
		}
		return n
	}
	if r := resident(b); r < 64 {
		t.Fatalf("%d pages resident after writing 64", r)
	}
	dropPages(b)
	if r := resident(b); r > 2 {
		t.Fatalf("%d pages resident after dropPages, want at most the 2 partial ones", r)
	}
	head := page - 100
	for i := range b {
		want := byte(i%251) + 1
		if i >= head && i < head+63*page {
			want = 0
		}
		if b[i] != want {
			t.Fatalf("byte %d = %d after dropPages, want %d", i, b[i], want)
		}
	}
	small := make([]byte, 8*page)
	for i := range small {
		small[i] = 7
	}
	dropPages(small)
	for i := range small {
		if small[i] != 7 {
			t.Fatalf("a buffer of 8 pages changed at %d", i)
		}
	}
}

package buffers

import (
	"bufio"
	"fmt"
	"os"
	"strings"
	"testing"
)

// TestArenaHugePageAligned: an arena of at least one huge page starts on
// a huge-page boundary, exactly as long as asked, and the over-mapped ends
// are given back (no mapping is left around it); where the system has
// transparent huge pages for madvised memory, a pinned arena is backed by
// them.
func TestArenaHugePageAligned(t *testing.T) {
	for _, n := range []int{hugePageBytes, 3*hugePageBytes + 4096, 64 << 20} {
		mem, err := mapArena(n)
		if err != nil {
			t.Fatal(err)
		}
		start := addrOf(mem)
		if start%hugePageBytes != 0 || len(mem) != n || cap(mem) != n {
			t.Fatalf("arena of %d bytes at %#x (len %d, cap %d): want a %d-byte boundary and exactly n bytes", n, start, len(mem), cap(mem), hugePageBytes)
		}
		// The mapping holding the arena ends where the arena ends: the
		// trimmed tail is unmapped.
		lo, hi := mappingAround(t, start)
		if lo > start || hi != start+uintptr(n) {
			t.Errorf("arena [%#x, %#x) lies in mapping [%#x, %#x): the trimmed ends were not unmapped", start, start+uintptr(n), lo, hi)
		}
		if n == 64<<20 {
			if err := mlockRegion(mem); err == nil {
				if kb := anonHugeKB(t, start); kb > 0 {
					t.Logf("64 MiB arena backed by %d KiB of huge pages", kb)
				} else {
					t.Logf("no huge pages backing the arena (THP: %s)", thpMode())
				}
				munlockRegion(mem)
			}
		}
		if err := unmapArena(mem); err != nil {
			t.Fatal(err)
		}
	}
	small, err := mapArena(hugePageBytes / 2)
	if err != nil {
		t.Fatal(err)
	}
	if len(small) != hugePageBytes/2 || addrOf(small)%uintptr(pageSize()) != 0 {
		t.Fatalf("small arena: len %d at %#x", len(small), addrOf(small))
	}
	unmapArena(small)
}

// mappingAround returns the bounds of the /proc/self/maps line holding addr.
func mappingAround(t *testing.T, addr uintptr) (lo, hi uintptr) {
	t.Helper()
	f, err := os.Open("/proc/self/maps")
	if err != nil {
		t.Skip(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var a, b uintptr
		if _, err := fmt.Sscanf(strings.Fields(sc.Text())[0], "%x-%x", &a, &b); err == nil && a <= addr && addr < b {
			return a, b
		}
	}
	t.Fatalf("no mapping holds %#x", addr)
	return 0, 0
}

// anonHugeKB reads AnonHugePages of the smaps entry holding addr.
func anonHugeKB(t *testing.T, addr uintptr) int {
	t.Helper()
	f, err := os.Open("/proc/self/smaps")
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	in := false
	for sc.Scan() {
		line := sc.Text()
		var a, b uintptr
		if n, _ := fmt.Sscanf(strings.Fields(line)[0], "%x-%x", &a, &b); n == 2 {
			in = a <= addr && addr < b
			continue
		}
		var kb int
		if in && strings.HasPrefix(line, "AnonHugePages:") {
			fmt.Sscanf(strings.TrimPrefix(line, "AnonHugePages:"), "%d", &kb)
			return kb
		}
	}
	return 0
}

func thpMode() string {
	b, err := os.ReadFile("/sys/kernel/mm/transparent_hugepage/enabled")
	if err != nil {
		return "unknown"
	}
	return strings.TrimSpace(string(b))
}

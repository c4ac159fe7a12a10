package blockdev

import (
	"errors"
	"os"
	"runtime"
	"testing"
	"time"
)

func TestParseStat(t *testing.T) {
	st, err := parseStat(" 6343060   915919 1160140618  6856238  4845846  2396843 1217067523  3555530        0   996424 10623524   445862      247 676757360   200882    45686    10872\n")
	if err != nil {
		t.Fatal(err)
	}
	want := Stat{Reads: 6343060, BytesRead: 1160140618 * 512, Writes: 4845846, BytesWritten: 1217067523 * 512,
		Busy: 996424 * time.Millisecond, InFlight: 10623524 * time.Millisecond, Timed: true}
	if st != want {
		t.Fatalf("%+v, want %+v", st, want)
	}
	// A kernel's older, shorter line: the counts without the times.
	st, err = parseStat("1 2 3 4 5 6 7")
	if want := (Stat{Reads: 1, BytesRead: 3 * 512, Writes: 5, BytesWritten: 7 * 512}); err != nil || st != want {
		t.Fatalf("%+v, %v; want %+v", st, err, want)
	}
	for _, bad := range []string{"", "1 2 3", "1 2 x 4 5 6 7", "1 2 -3 4 5 6 7", "1 2 3 4 5 6 99999999999999999999", "1 2 36028797018963968 4 5 6 7",
		"1 2 3 4 5 6 7 8 9 x 11", "1 2 3 4 5 6 7 8 9 10 -11", "1 2 3 4 5 6 7 8 9 9223372036854775 11"} {
		if _, err := parseStat(bad); err == nil {
			t.Errorf("%q parsed", bad)
		}
	}
}

// TestOf finds the disk under the test's temp dir and reads its counters;
// where the temp dir has no block device (tmpfs) it must say so with
// ErrNoDevice. Writing a file's worth through fsync moves the counter.
func TestOf(t *testing.T) {
	if runtime.GOOS != "linux" {
		if _, err := Of(t.TempDir()); !errors.Is(err, ErrNoDevice) {
			t.Fatalf("Of off Linux: %v", err)
		}
		return
	}
	dir := t.TempDir()
	d, err := Of(dir)
	if errors.Is(err, ErrNoDevice) {
		t.Skipf("no block device under %s: %v", dir, err)
	}
	if err != nil {
		t.Fatal(err)
	}
	if d.Name == "" || d.Name == d.Partition {
		t.Fatalf("device %+v", d)
	}
	before, err := ReadStat(d.Name)
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.Create(dir + "/x")
	if err != nil {
		t.Fatal(err)
	}
	f.Write(make([]byte, 1<<20))
	f.Sync()
	f.Close()
	after, err := ReadStat(d.Name)
	if err != nil {
		t.Fatal(err)
	}
	if after.BytesWritten < before.BytesWritten || after.Writes < before.Writes || after.Busy < before.Busy || after.InFlight < before.InFlight {
		t.Fatalf("counters went back: %+v then %+v", before, after)
	}
	// Every Linux kernel zinf runs on (4.x and later) gives the times.
	if !after.Timed {
		t.Fatalf("%s's counters without io_ticks: %+v", d.Name, after)
	}
	if after.BytesWritten == before.BytesWritten {
		t.Logf("note: a 1 MiB fsync'ed write did not show in %s's counters (a virtual disk may lag)", d.Name)
	}
	for _, bad := range []string{"", "..", "a/b"} {
		if _, err := ReadStat(bad); err == nil {
			t.Errorf("ReadStat(%q) succeeded", bad)
		}
	}
	if _, err := Of(dir + "/missing"); err == nil {
		t.Error("Of of a missing path succeeded")
	}
	if up, err := Uptime(); err != nil || up <= 0 {
		t.Errorf("uptime %v, %v", up, err)
	}
}

// TestProcessIO: this process's storage counters parse, and a bad file is
// an error naming the field.
func TestProcessIO(t *testing.T) {
	st, err := parseProcIO("rchar: 10\nwchar: 20\nsyscr: 1\nsyscw: 2\nread_bytes: 4096\nwrite_bytes: 8192\ncancelled_write_bytes: 0\n")
	if err != nil || st.BytesRead != 4096 || st.BytesWritten != 8192 {
		t.Fatalf("parsed %+v, %v", st, err)
	}
	for _, bad := range []string{"read_bytes: x\nwrite_bytes: 1\n", "read_bytes: 1\n", "read_bytes: -1\nwrite_bytes: 1\n"} {
		if _, err := parseProcIO(bad); err == nil {
			t.Errorf("%q parsed", bad)
		}
	}
	if runtime.GOOS == "linux" {
		if _, err := ProcessIO(); err != nil {
			t.Fatal(err)
		}
	}
}

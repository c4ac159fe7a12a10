package ckptbench_test

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/zinfio/zinf/checkpoint"
	"github.com/zinfio/zinf/cmd/zinf/internal/ckptbench"
)

// CompareSave runs its rounds against a stand-in fio (a script printing a
// fixed JSON report, so the test needs no fio and knows the figure fio
// "measured"), fills the medians and ratios, and leaves nothing in Dir.
func TestCompareSaveWithStandInFio(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	dir := t.TempDir()
	fio := filepath.Join(t.TempDir(), "fio")
	script := "#!/bin/sh\necho 'fio: a warning before the report'\n" +
		`echo '{"jobs":[{"write":{"io_bytes":8000000,"bw_bytes":1,"runtime":1000}}]}'` + "\n"
	if err := os.WriteFile(fio, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	var progress bytes.Buffer
	res, err := ckptbench.CompareSave(ctx, ckptbench.CompareOptions{
		Dir: dir, SizeBytes: 4 << 20, Rounds: 2, FioPath: fio, Progress: &progress,
		Save: checkpoint.SaveOptions{StagingBytes: 1 << 20},
	})
	if err != nil {
		if strings.Contains(err.Error(), "O_DIRECT") {
			t.Skipf("no O_DIRECT on %s: %v", dir, err)
		}
		t.Fatal(err)
	}
	if len(res.SaveGBps) != 2 || len(res.FioGBps) != 2 || res.SaveMedian <= 0 {
		t.Fatalf("result %+v", res)
	}
	// 8e6 bytes in 1000 ms: 0.008 GB/s, from io_bytes over runtime.
	if res.FioMedian != 0.008 || res.SaveOverFio != res.SaveMedian/0.008 {
		t.Fatalf("fio median %v, ratio %v (save median %v)", res.FioMedian, res.SaveOverFio, res.SaveMedian)
	}
	if !strings.Contains(strings.Join(res.FioArgs, " "), "--end_fsync=1") {
		t.Fatalf("fio args %v", res.FioArgs)
	}
	var table bytes.Buffer
	if err := res.WriteTable(&table); err != nil || !strings.Contains(table.String(), "fio write") || !strings.Contains(table.String(), "zinf Save") {
		t.Fatalf("table (%v):\n%s", err, table.String())
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 0 {
		t.Fatalf("CompareSave left %d entries in %s", len(entries), dir)
	}
	// A stand-in that fails is reported with its command line.
	if err := os.WriteFile(fio, []byte("#!/bin/sh\necho broken >&2\nexit 3\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	_, err = ckptbench.CompareSave(ctx, ckptbench.CompareOptions{Dir: dir, SizeBytes: 1 << 20, Rounds: 1, FioPath: fio, Save: checkpoint.SaveOptions{StagingBytes: 1 << 20}})
	if err == nil || !strings.Contains(err.Error(), "broken") || !strings.Contains(err.Error(), "--rw=write") {
		t.Fatalf("a failing fio: %v", err)
	}
}

// Invalid options are refused before anything is written, naming the
// option.
func TestCompareSaveRefuses(t *testing.T) {
	for _, o := range []ckptbench.CompareOptions{
		{},
		{Dir: t.TempDir(), SizeBytes: -1, NoFio: true},
		{Dir: t.TempDir(), Source: "tape", NoFio: true},
	} {
		if _, err := ckptbench.CompareSave(context.Background(), o); err == nil {
			t.Errorf("CompareSave(%+v) succeeded", o)
		}
	}
	if _, err := ckptbench.SaveBench(context.Background(), t.TempDir(), 0, checkpoint.SaveOptions{}); err == nil {
		t.Error("SaveBench of 0 bytes succeeded")
	}
}

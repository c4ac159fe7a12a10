package checkpoint_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/zinfio/zinf/checkpoint"
	"github.com/zinfio/zinf/comm"
	"github.com/zinfio/zinf/swapper"
)

// rankState is rank r's part: two tensors whose bytes name the rank.
func rankState(r, step int) checkpoint.State {
	a := bytes.Repeat([]byte{byte(r + 1)}, 4*(10+r))
	b := bytes.Repeat([]byte{byte(0x80 | r)}, 2*(3+r))
	return checkpoint.State{Step: int64(step), Config: []byte(`{"x":1}`), User: map[string]string{"who": "test"},
		Ranks: []checkpoint.RankState{{Rank: r, Files: []checkpoint.TensorFile{{Name: "a.safetensors", Tensors: []checkpoint.Tensor{
			checkpoint.FromBytes("a", swapper.Float32, []int64{int64(10 + r)}, a),
			checkpoint.FromBytes("b", swapper.BFloat16, []int64{int64(3 + r)}, b),
		}}}}}}
}

// sharedSave runs SaveShared on every rank of a fresh in-process world;
// state gives each rank's State.
func sharedSave(t *testing.T, n int, dir string, opts checkpoint.SaveOptions, state func(r int) checkpoint.State) ([]*checkpoint.Manifest, []error) {
	t.Helper()
	cs, err := comm.NewLocal(n, comm.LocalOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ms, errs := make([]*checkpoint.Manifest, n), make([]error, n)
	var wg sync.WaitGroup
	for r := range n {
		wg.Go(func() {
			w := checkpoint.NewWriter()
			defer w.Close()
			ms[r], errs[r] = w.SaveShared(context.Background(), dir, state(r), opts, cs[r])
		})
	}
	wg.Wait()
	return ms, errs
}

// TestSaveShared: ranks as separate writers (goroutines of an in-process
// world, as processes of an MPI job would be) save one checkpoint; it
// verifies, every rank's tensors read back, and KeepLast keeps the
// newest two.
func TestSaveShared(t *testing.T) {
	root := t.TempDir()
	const n = 3
	for step := 1; step <= 3; step++ {
		dir := filepath.Join(root, fmt.Sprintf("step-%06d", step))
		ms, errs := sharedSave(t, n, dir, checkpoint.SaveOptions{KeepLast: 2}, func(r int) checkpoint.State { return rankState(r, step) })
		for r, err := range errs {
			if err != nil {
				t.Fatalf("step %d rank %d: %v", step, r, err)
			}
			if ms[r].WorldSize != n || len(ms[r].Ranks) != n || ms[r].Dir != dir {
				t.Fatalf("rank %d: manifest %+v", r, ms[r])
			}
		}
		rep, err := checkpoint.Verify(context.Background(), dir)
		if err != nil {
			t.Fatalf("step %d: verify: %v (%+v)", step, err, rep)
		}
		for r := range n {
			rd, err := checkpoint.OpenRank(dir, r)
			if err != nil {
				t.Fatal(err)
			}
			got := make([]byte, 4*(10+r))
			if err := rd.ReadTensor(context.Background(), "a", got); err != nil {
				t.Fatal(err)
			}
			rd.Close()
			if !bytes.Equal(got, bytes.Repeat([]byte{byte(r + 1)}, len(got))) {
				t.Fatalf("rank %d's tensor a reads back wrong", r)
			}
		}
	}
	list, err := checkpoint.List(root)
	if err != nil || len(list) != 2 || list[0].Step != 2 {
		t.Fatalf("after three saves with KeepLast 2: %+v, %v", list, err)
	}
	entries, _ := os.ReadDir(root)
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), ".") {
			t.Errorf("left behind: %s", e.Name())
		}
	}
}

// TestSaveSharedRankFails: one rank's part is refused (here: a State
// naming another rank; a full disk takes the same path); every rank's
// save fails naming it, nothing is committed and nothing is left.
func TestSaveSharedRankFails(t *testing.T) {
	root := t.TempDir()
	dir := filepath.Join(root, "step-000001")
	_, errs := sharedSave(t, 3, dir, checkpoint.SaveOptions{}, func(r int) checkpoint.State {
		if r == 2 {
			return rankState(1, 1)
		}
		return rankState(r, 1)
	})
	for r, err := range errs {
		if err == nil || (r != 2 && !strings.Contains(err.Error(), "rank 2 failed")) {
			t.Errorf("rank %d: %v, want an error naming rank 2", r, err)
		}
	}
	if r := errs[2]; !errors.Is(r, checkpoint.ErrInvalid) {
		t.Errorf("rank 2's own error: %v", r)
	}
	entries, _ := os.ReadDir(root)
	if len(entries) != 0 {
		t.Errorf("left in the root: %v", entries)
	}
}

package swapper_test

import (
	"bytes"
	"context"
	"errors"
	"testing"

	"github.com/zinfio/zinf/aio"
	"github.com/zinfio/zinf/swapper"
)

// TestPinKeepsVersion: a pinned version stays readable, unchanged, after
// its name is overwritten, renamed over and deleted; its extents are freed
// (and reused) only after Release.
func TestPinKeepsVersion(t *testing.T) {
	for _, paths := range []int{1, 2} {
		r := newRig(t, paths, true, aio.BackendAuto)
		ctx := context.Background()
		const n = 200_000
		v1 := r.buf(t, n, 1).Bytes()[:n]
		if err := r.store.Write(ctx, "w", v1); err != nil {
			t.Fatal(err)
		}
		if err := r.store.Write(ctx, "b", r.buf(t, 10, 9).Bytes()[:10]); err != nil {
			t.Fatal(err)
		}
		p, err := r.store.Pin("w", "b", "w")
		if err != nil {
			t.Fatal(err)
		}
		if l, ok := p.Len("w"); !ok || l != n {
			t.Fatalf("Len = %d, %v", l, ok)
		}
		// Training goes on: a new version, then a staged one renamed over
		// it, then a delete.
		if err := r.store.Write(ctx, "w", r.buf(t, n, 2).Bytes()[:n]); err != nil {
			t.Fatal(err)
		}
		if err := r.store.Write(ctx, "w@next", r.buf(t, n, 3).Bytes()[:n]); err != nil {
			t.Fatal(err)
		}
		if err := r.store.Rename([2]string{"w@next", "w"}); err != nil {
			t.Fatal(err)
		}
		r.store.Delete("b")
		got := r.buf(t, n, 0xEE).Bytes()[:n]
		if err := p.Read(ctx, "w", got); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, v1) {
			t.Fatal("the pinned version changed")
		}
		cur := r.buf(t, n, 0xEE).Bytes()[:n]
		if err := r.store.Read(ctx, "w", cur); err != nil || !bytes.Equal(cur, r.buf(t, n, 3).Bytes()[:n]) {
			t.Fatalf("the current version is not the last one renamed: %v", err)
		}
		if err := p.Read(ctx, "x", got); !errors.Is(err, swapper.ErrNotFound) {
			t.Fatalf("reading an unpinned name: %v", err)
		}
		p.Release()
		p.Release()
		if err := p.Read(ctx, "w", got); err == nil {
			t.Fatal("read after Release succeeded")
		}
		r.store.Delete("w")
		if live := r.store.Stats().LiveBytes; live != 0 {
			t.Fatalf("live bytes %d after deleting everything", live)
		}
	}
}

func TestPinMissingPinsNothing(t *testing.T) {
	r := newRig(t, 1, false, aio.BackendAuto)
	if err := r.store.Write(context.Background(), "a", r.buf(t, 100, 1).Bytes()[:100]); err != nil {
		t.Fatal(err)
	}
	if _, err := r.store.Pin("a", "missing"); !errors.Is(err, swapper.ErrNotFound) {
		t.Fatalf("Pin of a missing name: %v", err)
	}
}

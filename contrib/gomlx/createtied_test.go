package zgomlx_test

import (
	"testing"
	"time"

	"github.com/gomlx/compute/dtypes"
	"github.com/gomlx/compute/shapes"
	"github.com/gomlx/gomlx/ml/model"

	zgomlx "github.com/zinfio/zinf/contrib/gomlx"
)

// TestCreateTiedEmbeddings: Create makes a zoo transformer whose head is
// tied to its embedding table (the head's layer borrows a variable its
// own scratch Store would not have) with the values Initialize gives the
// model in memory, bit for bit, and it trains.
func TestCreateTiedEmbeddings(t *testing.T) {
	ctx := watchdog(t, 3*time.Minute)
	b := backend(t)
	xs := shapes.Make(dtypes.Int32, 1, 8)
	const vocab = 1000
	store := model.NewStore()
	net, err := zgomlx.TransformerNet(bigVocabModel(store, vocab), zgomlx.TransformerOptions{TieEmbeddings: true})
	if err != nil {
		t.Fatal(err)
	}
	tr, err := zgomlx.Create(ctx, b, testConfig(t, 8<<20), store, net, zgomlx.Options{}, xs)
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	mem := model.NewStore()
	memNet, err := zgomlx.TransformerNet(bigVocabModel(mem, vocab), zgomlx.TransformerOptions{TieEmbeddings: true})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := zgomlx.Initialize(b, mem, memNet, xs); err != nil {
		t.Fatal(err)
	}
	off := tr.Offload()
	if len(off.Vars()) == 0 {
		t.Fatal("no variables registered")
	}
	for _, v := range off.Vars() {
		got, err := off.ReadVariable(ctx, v.Name)
		if err != nil {
			t.Fatal(err)
		}
		mv := mem.GetVariable(v.Name)
		if mv == nil {
			t.Fatalf("%s: not in the in-memory model", v.Name)
		}
		want, err := mv.Value()
		if err != nil {
			t.Fatal(err)
		}
		sameBytes(t, v.Name+" created vs initialized in memory", valueBytes(t, got), valueBytes(t, want))
	}
	const table = "/token_embed/embeddings"
	before, err := off.ReadVariable(ctx, table)
	if err != nil {
		t.Fatal(err)
	}
	x, y := lmBatch(0, 1, 8, vocab)
	if _, err := tr.Step(ctx, x, y); err != nil {
		t.Fatal(err)
	}
	after, err := off.ReadVariable(ctx, table)
	if err != nil {
		t.Fatal(err)
	}
	if string(valueBytes(t, before)) == string(valueBytes(t, after)) {
		t.Fatal("a step left the tied table unchanged")
	}
}

package checkpoint

import (
	"bytes"
	"context"
	"encoding/json"
	"math/rand/v2"
	"path/filepath"
	"reflect"
	"testing"

	"github.com/zinfio/zinf/swapper"
)

// roundTripSizes covers empty, tiny, unaligned around a 4 KiB block, a
// staging buffer boundary and tens of MiB.
var roundTripSizes = []int{0, 2, 4, 6, 12, 4094, 4096, 4098, 65536 - 2, 65536 + 6, 1<<20 + 6, 3 << 20, 24<<20 + 2, 1, 3}

func TestRoundTrip(t *testing.T) {
	seed := uint64(1)
	rng := rand.New(rand.NewPCG(seed, seed))
	sizes := append([]int{}, roundTripSizes...)
	sizes = sizes[:len(sizes)-2] // 1 and 3 bytes are not whole elements of any dtype: below
	specs := makeSpecs(rng, []string{"params.safetensors", "optimizer.safetensors", "extra.safetensors"}, sizes)
	cases := []struct {
		name string
		opts SaveOptions
	}{
		{"defaults", SaveOptions{}},
		{"small-staging", SaveOptions{StagingBytes: 64 << 10, StagingBuffers: 2, Parallel: 3}},
		{"one-buffer-serial", SaveOptions{StagingBytes: 16 << 10, StagingBuffers: 1, Parallel: 1}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			root := t.TempDir()
			dir := filepath.Join(root, "step-000007")
			st := stateOf(7, specs, fromMemory)
			st.ModelShape = map[string][]int64{"layer.0.weight": {4, 8}}
			m, err := Save(context.Background(), dir, st, c.opts)
			if err != nil {
				t.Fatal(err)
			}
			if m.Dir != dir || m.Step != 7 || m.WorldSize != 1 || len(m.RankManifests) != 1 || len(m.RankManifests[0].Tensors) != len(specs) {
				t.Fatalf("manifest %+v", m)
			}
			checkReadBack(t, dir, 0, specs)
			r, err := Open(dir)
			if err != nil {
				t.Fatal(err)
			}
			defer r.Close()
			meta := r.Meta()
			if meta.Step != 7 || meta.Rank != 0 || meta.WorldSize != 1 || meta.Name != "step-000007" || meta.User["run"] != "test" {
				t.Fatalf("meta %+v", meta)
			}
			var got, want any
			json.Unmarshal(meta.Config, &got)
			json.Unmarshal(st.Config, &want)
			if !reflect.DeepEqual(got, want) {
				t.Fatalf("config %s, want %s", meta.Config, st.Config)
			}
			if err := r.CheckModelShape(st.ModelShape); err != nil {
				t.Fatal(err)
			}
			rep, err := Verify(context.Background(), dir)
			if err != nil {
				t.Fatal(err)
			}
			if rep.Tensors != len(specs) || rep.Files != 3 || !rep.OK() {
				t.Fatalf("report %+v", rep)
			}
			if l, err := Latest(root); err != nil || l != dir {
				t.Fatalf("Latest = %q, %v; want %q", l, err, dir)
			}
		})
	}
}

func TestRoundTripFromStore(t *testing.T) {
	rng := rand.New(rand.NewPCG(2, 2))
	eng := testEngine(t, nil)
	store, pool := newStore(t, eng)
	specs := makeSpecs(rng, []string{"params.safetensors", "optimizer.safetensors"}, []int{4, 4098, 1<<20 + 6, 12 << 20, 6})
	for _, s := range specs {
		writeStore(t, store, pool, "swap."+s.name, s.data)
	}
	// One memory tensor among the store ones.
	mem := makeSpecs(rng, []string{"params.safetensors"}, []int{8192 + 4})
	mem[0].name = "memory.tensor"
	specs = append(specs, mem...)
	mk := func(s spec) Tensor {
		if s.name == "memory.tensor" {
			return fromMemory(s)
		}
		t := FromStore(store, "swap."+s.name, s.dtype, s.shape)
		t.Name = s.name
		return t
	}
	for _, opts := range []SaveOptions{{Engine: eng}, {StagingBytes: 64 << 10, Parallel: 1}} {
		root := t.TempDir()
		dir := filepath.Join(root, "step-000001")
		if _, err := Save(context.Background(), dir, stateOf(1, specs, mk), opts); err != nil {
			t.Fatal(err)
		}
		checkReadBack(t, dir, 0, specs)
	}
	// The async path snapshots store tensors too.
	s := NewSaver(SaverOptions{})
	defer s.Close()
	dir := filepath.Join(t.TempDir(), "step-000002")
	h, err := s.SaveAsync(context.Background(), dir, stateOf(2, specs, mk), SaveOptions{Engine: eng})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := h.Wait(); err != nil {
		t.Fatal(err)
	}
	checkReadBack(t, dir, 0, specs)

	// Tensor.Read of a store tensor (the slow path) works too.
	tt := FromStore(store, "swap."+specs[2].name, specs[2].dtype, specs[2].shape)
	part := make([]byte, 100)
	if err := tt.Read(context.Background(), part, 4000); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(part, specs[2].data[4000:4100]) {
		t.Fatal("FromStore Read returned other bytes")
	}
	// A name not in the store is reported by Save.
	bad := stateOf(3, specs[:1], func(s spec) Tensor { return FromStore(store, "missing", s.dtype, s.shape) })
	if _, err := Save(context.Background(), filepath.Join(t.TempDir(), "x"), bad, SaveOptions{}); err == nil {
		t.Fatal("Save of a tensor missing from the store succeeded")
	}
}

func TestMultiRank(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 3))
	const world = 3
	root := t.TempDir()
	dir := filepath.Join(root, "step-000010")
	st := State{Step: 10, ModelShape: map[string][]int64{"w": {world * 1000}}, User: map[string]string{"k": "v"}}
	perRank := make([][]spec, world)
	for r := range world {
		perRank[r] = makeSpecs(rng, []string{"params.safetensors", "optimizer.safetensors"}, []int{4000 + r*2, 6, 1 << 16})
		one := stateOf(10, perRank[r], fromMemory)
		rs := one.Ranks[0]
		rs.Rank = world - 1 - r // out of order on purpose
		rs.User = map[string]string{"shard": string(rune('a' + r))}
		st.Ranks = append(st.Ranks, rs)
	}
	if _, err := Save(context.Background(), dir, st, SaveOptions{Parallel: 4}); err != nil {
		t.Fatal(err)
	}
	ranks, err := ListRanks(dir)
	if err != nil || len(ranks) != world {
		t.Fatalf("ListRanks = %v, %v", ranks, err)
	}
	for r := range world {
		checkReadBack(t, dir, world-1-r, perRank[r])
		rd, err := Open(ranks[world-1-r].Dir)
		if err != nil {
			t.Fatal(err)
		}
		m := rd.Meta()
		if m.Rank != world-1-r || m.WorldSize != world || m.User["shard"] != string(rune('a'+r)) || m.User["k"] != "v" {
			t.Fatalf("rank meta %+v", m)
		}
		rd.Close()
	}
	if _, err := Open(dir); err == nil {
		t.Fatal("Open of a 3-rank checkpoint without a rank succeeded")
	}
	if rep, err := Verify(context.Background(), dir); err != nil || rep.Ranks != world || rep.Files != 2*world {
		t.Fatalf("Verify = %+v, %v", rep, err)
	}
}

func TestOverwriteAndRetention(t *testing.T) {
	rng := rand.New(rand.NewPCG(4, 4))
	root := t.TempDir()
	w := NewWriter()
	defer w.Close()
	var last []spec
	for step := int64(1); step <= 5; step++ {
		last = makeSpecs(rng, []string{"p.safetensors"}, []int{4096 + int(step)*2})
		if _, err := w.Save(context.Background(), filepath.Join(root, stepName(step)), stateOf(step, last, fromMemory), SaveOptions{KeepLast: 2}); err != nil {
			t.Fatal(err)
		}
	}
	list, err := List(root)
	if err != nil || len(list) != 2 || list[0].Step != 4 || list[1].Step != 5 {
		t.Fatalf("after KeepLast 2: %+v, %v\n%s", list, err, tree(root))
	}
	// Overwrite replaces step 5 atomically; without it the save fails.
	dir := filepath.Join(root, stepName(5))
	again := makeSpecs(rng, []string{"p.safetensors"}, []int{100})
	if _, err := w.Save(context.Background(), dir, stateOf(5, again, fromMemory), SaveOptions{}); err == nil {
		t.Fatal("Save over a committed checkpoint succeeded without Overwrite")
	}
	checkReadBack(t, dir, 0, last)
	if _, err := w.Save(context.Background(), dir, stateOf(5, again, fromMemory), SaveOptions{Overwrite: true}); err != nil {
		t.Fatal(err)
	}
	checkReadBack(t, dir, 0, again)
	// An older step saved last is kept ("never the one just written") even
	// though it is not among the newest.
	if _, err := w.Save(context.Background(), filepath.Join(root, stepName(2)), stateOf(2, again, fromMemory), SaveOptions{KeepLast: 1}); err != nil {
		t.Fatal(err)
	}
	list, _ = List(root)
	if len(list) != 2 || list[0].Step != 2 || list[1].Step != 5 {
		t.Fatalf("after KeepLast 1 with an old step: %+v\n%s", list, tree(root))
	}
	assertNoTemp(t, root)
}

func stepName(step int64) string { return "step-" + leftPad(step) }

func leftPad(n int64) string {
	s := []byte("000000")
	for i := len(s) - 1; i >= 0 && n > 0; i-- {
		s[i] = byte('0' + n%10)
		n /= 10
	}
	return string(s)
}

func assertNoTemp(t *testing.T, root string) {
	t.Helper()
	entries, _ := filepath.Glob(filepath.Join(root, ".tmp-*"))
	if len(entries) > 0 {
		t.Fatalf("temporary entries left: %v", entries)
	}
}

// A zero-length tensor, a scalar and a file with no tensors are fine.
func TestEdgeShapes(t *testing.T) {
	root := t.TempDir()
	dir := filepath.Join(root, "edge")
	st := State{Ranks: []RankState{{Files: []TensorFile{
		{Name: "a.safetensors", Tensors: []Tensor{
			FromBytes("empty", swapper.Float32, []int64{0, 5}, nil),
			FromBytes("scalar", swapper.Float32, nil, []byte{0, 0, 128, 63}),
			FromBytes("empty2", swapper.BFloat16, []int64{0}, []byte{}),
		}},
		{Name: "b.safetensors"},
	}}}}
	if _, err := Save(context.Background(), dir, st, SaveOptions{}); err != nil {
		t.Fatal(err)
	}
	r, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	v := make([]byte, 4)
	if err := r.ReadTensor(context.Background(), "scalar", v); err != nil || !bytes.Equal(v, []byte{0, 0, 128, 63}) {
		t.Fatalf("scalar: %v %v", v, err)
	}
	if err := r.ReadTensor(context.Background(), "empty", nil); err != nil {
		t.Fatal(err)
	}
	if _, err := Verify(context.Background(), dir); err != nil {
		t.Fatal(err)
	}
}

package main

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/zinfio/zinf/decoder"
	"github.com/zinfio/zinf/gguf"
)

// tinyModel writes a small llama model (f32, byte vocabulary) and returns
// its path.
func tinyModel(t *testing.T) string {
	t.Helper()
	c := decoder.Config{Vocab: 320, Dim: 64, Layers: 2, Heads: 4, KVHeads: 2, HeadDim: 16, FFNDim: 96,
		Block: decoder.PreNorm, Norm: decoder.RMSNorm, FinalNorm: decoder.RMSNorm, NormEps: 1e-5,
		Activation: decoder.SiLU, Gated: true, RoPEBase: 10000, RoPEInterleaved: true}
	w := gguf.NewWriter()
	if err := w.SetLlama("tiny", gguf.ModelShape{Dim: 64, Layers: 2, Heads: 4, KVHeads: 2, HeadDim: 16, FFNDim: 96, RoPEBase: 10000, NormEps: 1e-5}, 128); err != nil {
		t.Fatal(err)
	}
	if err := w.SetByteVocab(c.Vocab); err != nil {
		t.Fatal(err)
	}
	names, _ := c.Names(decoder.GGUFNames, "")
	rng := rand.New(rand.NewPCG(3, 4))
	for _, n := range names {
		s := c.Shape(n.Role)
		size := 1
		for _, d := range s {
			size *= d
		}
		b := make([]byte, 4*size)
		for i := range size {
			v := 1 + 0.1*rng.NormFloat64()
			if len(s) == 2 {
				v = rng.NormFloat64() / math.Sqrt(float64(s[1]))
			}
			binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(float32(v)))
		}
		if err := w.AddTensor(n.Name, gguf.F32, s, b); err != nil {
			t.Fatal(err)
		}
	}
	path := filepath.Join(t.TempDir(), "tiny.gguf")
	if err := w.WriteFile(path); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestDecode: zinf-decode prints one JSON result; every sequence of a
// batch with the same prompt generates what batch 1 generates.
func TestDecode(t *testing.T) {
	path := tinyModel(t)
	decode := func(args ...string) Result {
		t.Helper()
		var out, errb bytes.Buffer
		if err := run(context.Background(), append([]string{"-model", path, "-pin", "off"}, args...), &out, &errb); err != nil {
			t.Fatalf("%v: %v\n%s", args, err, errb.String())
		}
		var r Result
		if err := json.Unmarshal(out.Bytes(), &r); err != nil {
			t.Fatalf("output %q: %v", out.String(), err)
		}
		return r
	}
	one := decode("-prompt-bytes", "zinf", "-tokens", "6")
	if one.Batch != 1 || one.Tokens != 6 || one.Prompt != 5 || len(one.IDs) != 1 || len(one.IDs[0]) != 6 || one.TokensPerS <= 0 || one.Types != "f32" {
		t.Fatalf("result %+v", one)
	}
	four := decode("-prompt-bytes", "zinf", "-tokens", "6", "-batch", "4", "-threads", "2")
	for b := range 4 {
		if !slices.Equal(four.IDs[b], one.IDs[0]) {
			t.Fatalf("sequence %d of batch 4 generated %v, batch 1 %v", b, four.IDs[b], one.IDs[0])
		}
	}
	diff := decode("-prompt-len", "5", "-tokens", "3", "-batch", "2")
	if diff.Prompt != 5 || len(diff.IDs) != 2 {
		t.Fatalf("result %+v", diff)
	}
	// -cpuprofile writes a profile of the steps (a gzip stream).
	prof := filepath.Join(t.TempDir(), "cpu.prof")
	decode("-tokens", "3", "-cpuprofile", prof)
	if b, err := os.ReadFile(prof); err != nil || len(b) < 2 || b[0] != 0x1f || b[1] != 0x8b {
		t.Fatalf("-cpuprofile %s: %d bytes, %v", prof, len(b), err)
	}
}

// TestDecodeFlags: bad flags are refused naming the flag and what is
// allowed.
func TestDecodeFlags(t *testing.T) {
	path := tinyModel(t)
	for _, tc := range []struct {
		args []string
		want string
	}{
		{nil, "-model is required"},
		{[]string{"-model", path, "-batch", "0"}, "-batch 0 is outside 1..64"},
		{[]string{"-model", path, "-tokens", "200"}, "context_length 128"},
		{[]string{"-model", path, "-prompt-ids", "1,999"}, `-prompt-ids: "999" is not a token id 0..319`},
		{[]string{"-model", path, "-prompt-ids", "1", "-prompt-len", "3"}, "exclude each other"},
		{[]string{"-model", path, "-pin", "maybe"}, "allowed: auto, required, off"},
		{[]string{"-model", path, "-threads", "-1"}, "-threads -1 is outside 0..1024"},
		{[]string{"-model", path, "-threads", "1025"}, "-threads 1025 is outside 0..1024"},
		{[]string{"-model", filepath.Join(t.TempDir(), "none.gguf")}, "no such file"},
		// A profile never overwrites a file (here the model itself).
		{[]string{"-model", path, "-cpuprofile", path}, "-cpuprofile"},
	} {
		var out, errb bytes.Buffer
		err := run(context.Background(), tc.args, &out, &errb)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: %v, want an error holding %q", tc.args, err, tc.want)
		}
	}
}

// TestDecodeStream: with -stream the weights come through a zinf pinned
// pool, and the generated tokens are those of the weights read whole; the
// result says what was kept, streamed and read.
func TestDecodeStream(t *testing.T) {
	path := tinyModel(t)
	decode := func(args ...string) Result {
		t.Helper()
		var out, errb bytes.Buffer
		if err := run(context.Background(), append([]string{"-model", path}, args...), &out, &errb); err != nil {
			t.Fatalf("%v: %v\n%s", args, err, errb.String())
		}
		var r Result
		if err := json.Unmarshal(out.Bytes(), &r); err != nil {
			t.Fatalf("output %q: %v", out.String(), err)
		}
		return r
	}
	whole := decode("-pin", "off", "-prompt-len", "4", "-tokens", "5", "-batch", "2")
	dir := t.TempDir()
	for _, keep := range []string{"0", "64KiB"} {
		s := decode("-stream", "-dir", dir, "-pool", "8MiB", "-max-in-cpu", keep, "-prompt-len", "4", "-tokens", "5", "-batch", "2")
		for b := range whole.IDs {
			if !slices.Equal(s.IDs[b], whole.IDs[b]) {
				t.Fatalf("-max-in-cpu %s: sequence %d streamed %v, whole %v", keep, b, s.IDs[b], whole.IDs[b])
			}
		}
		st := s.Stream
		if st == nil || st.StreamedBytes <= 0 || st.PoolBytes != 8<<20 || st.StepReadBytes <= 0 || st.StepReadBytes > 2*st.StreamedBytes || st.FloorMs <= 0 || st.RSSBoundMiB <= 0 {
			t.Fatalf("-max-in-cpu %s: stream result %+v", keep, st)
		}
		if (keep == "0") != (st.KeptBytes == 0) {
			t.Errorf("-max-in-cpu %s: kept %d bytes", keep, st.KeptBytes)
		}
	}
	if entries, err := os.ReadDir(dir); err != nil {
		t.Fatal(err)
	} else {
		for _, e := range entries {
			t.Logf("left in -dir: %s", e.Name())
		}
	}
	var out, errb bytes.Buffer
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"-model", path, "-pool", "8MiB"}, "-pool and -max-in-cpu are for -stream"},
		{[]string{"-model", path, "-dir", dir}, "-dir is for -stream"},
		{[]string{"-model", path, "-config", "x.json"}, "-config is for -stream"},
		{[]string{"-model", path, "-stream", "-pin", "off"}, "-pin is for the weights read whole"},
		{[]string{"-model", path, "-stream", "-max-in-cpu", "lots"}, `"lots" is not a size`},
		{[]string{"-model", path, "-stream", "-config", filepath.Join(dir, "none.json")}, "-config"},
	} {
		err := run(context.Background(), tc.args, &out, &errb)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: %v, want an error holding %q", tc.args, err, tc.want)
		}
	}
}

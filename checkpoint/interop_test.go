package checkpoint

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"hash/crc32"
	"math"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"

	"github.com/zinfio/zinf/swapper"
)

// systemPython is Debian's python, where apt's python3-numpy goes (a
// pyenv python first on PATH would not see it).
const systemPython = "/usr/bin/python3"

// requireNumpy skips the test unless systemPython can import numpy,
// installing python3-numpy with apt-get first when allowed: as root with
// CI=true or ZINF_INSTALL_DEPS=1.
func requireNumpy(t *testing.T) {
	t.Helper()
	if _, err := os.Stat(systemPython); err != nil {
		t.Skipf("interop test needs %s (with numpy): not found", systemPython)
	}
	if exec.Command(systemPython, "-c", "import numpy").Run() == nil {
		return
	}
	allowed := os.Geteuid() == 0 && (os.Getenv("CI") == "true" || os.Getenv("ZINF_INSTALL_DEPS") == "1")
	if !allowed {
		t.Skipf("interop test needs numpy for %s: install it with `apt-get install -y python3-numpy`, "+
			"or run the tests as root with ZINF_INSTALL_DEPS=1 (or CI=true) so the test installs it", systemPython)
	}
	for _, args := range [][]string{{"update"}, {"install", "-y", "python3-numpy"}} {
		cmd := exec.Command("apt-get", args...)
		cmd.Env = append(os.Environ(), "DEBIAN_FRONTEND=noninteractive")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("apt-get %v: %v\n%s", args, err, out)
		}
	}
	if out, err := exec.Command(systemPython, "-c", "import numpy").CombinedOutput(); err != nil {
		t.Fatalf("numpy still missing after apt-get install python3-numpy: %v\n%s", err, out)
	}
}

// pyTensor is one line of read_safetensors.py's output.
type pyTensor struct {
	File     string            `json:"file"`
	Name     string            `json:"name"`
	DType    string            `json:"dtype"`
	Shape    []int64           `json:"shape"`
	CRCRaw   uint32            `json:"crc32_raw"`
	CRCF32   uint32            `json:"crc32_f32"`
	Sum      float64           `json:"sum"`
	First    []float64         `json:"first"`
	Metadata map[string]string `json:"metadata"`
}

func TestPythonInterop(t *testing.T) {
	requireNumpy(t)
	rng := rand.New(rand.NewPCG(41, 41))
	specs := makeSpecs(rng, []string{"params.safetensors", "optimizer.safetensors"},
		[]int{0, 2, 6, 12, 4094, 4098, 1<<20 + 6, 3<<20 + 2, 600})
	specs = append(specs, spec{file: "params.safetensors", name: "scalar", dtype: swapper.Float32, shape: []int64{},
		data: binary.LittleEndian.AppendUint32(nil, math.Float32bits(-1.5))})
	specs = append(specs, spec{file: "params.safetensors", name: "matrix/√unicode", dtype: swapper.BFloat16, shape: []int64{3, 5},
		data: randomTensorBytes(rng, swapper.BFloat16, 15)})
	dir := filepath.Join(t.TempDir(), "step-000042")
	st := stateOf(42, specs, fromMemory)
	if _, err := Save(context.Background(), dir, st, SaveOptions{StagingBytes: 1 << 20}); err != nil {
		t.Fatal(err)
	}
	script, _ := filepath.Abs(filepath.Join("testdata", "read_safetensors.py"))
	cmd := exec.Command(systemPython, script,
		filepath.Join(dir, "rank-00000", "params.safetensors"), filepath.Join(dir, "rank-00000", "optimizer.safetensors"))
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("read_safetensors.py: %v\n%s", err, stderr.String())
	}
	got := map[string]pyTensor{}
	sc := bufio.NewScanner(bytes.NewReader(out))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var p pyTensor
		if err := json.Unmarshal(sc.Bytes(), &p); err != nil {
			t.Fatalf("bad line %q: %v", sc.Text(), err)
		}
		got[p.Name] = p
	}
	if len(got) != len(specs) {
		t.Fatalf("python read %d tensors, zinf wrote %d", len(got), len(specs))
	}
	for _, s := range specs {
		p, ok := got[s.name]
		if !ok {
			t.Fatalf("python did not see tensor %q", s.name)
		}
		vals := toFloat32s(s.dtype, s.data)
		f32 := make([]byte, 4*len(vals))
		var sum, abs float64
		for i, v := range vals {
			binary.LittleEndian.PutUint32(f32[4*i:], math.Float32bits(v))
			sum += float64(v)
			abs += math.Abs(float64(v))
		}
		switch {
		case p.File != s.file || p.DType != s.dtype.SafetensorsName() || !slices.Equal(p.Shape, s.shape):
			t.Errorf("%s: python sees %s %s %v, zinf wrote %s %s %v", s.name, p.File, p.DType, p.Shape, s.file, s.dtype.SafetensorsName(), s.shape)
		case p.CRCRaw != crc32.ChecksumIEEE(s.data):
			t.Errorf("%s: raw bytes differ (crc32 %08x, want %08x)", s.name, p.CRCRaw, crc32.ChecksumIEEE(s.data))
		case p.CRCF32 != crc32.ChecksumIEEE(f32):
			t.Errorf("%s: values as float32 differ (crc32 %08x, want %08x)", s.name, p.CRCF32, crc32.ChecksumIEEE(f32))
		case math.Abs(p.Sum-sum) > 1e-9*abs+1e-9:
			t.Errorf("%s: sum %v, want %v", s.name, p.Sum, sum)
		case p.Metadata["zinf.format"] != FormatName || p.Metadata["zinf.step"] != "42" || p.Metadata["user.run"] != "test":
			t.Errorf("%s: metadata %v", s.name, p.Metadata)
		}
		for i, v := range p.First {
			if float32(v) != vals[i] {
				t.Errorf("%s: value %d is %v in python, %v in Go", s.name, i, v, vals[i])
			}
		}
	}
	t.Logf("python (numpy, no safetensors library) read %d tensors; raw bytes, float32 values and sums agree", len(got))
}

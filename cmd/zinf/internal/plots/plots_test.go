package plots

import (
	"bytes"
	"encoding/xml"
	"image/png"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/zinfio/zinf/cmd/zinf/internal/iobench"
	"github.com/zinfio/zinf/trace"
)

// decodes checks that a picture is a well-formed PNG of a plausible size,
// or SVG (XML) holding every text in want.
func decodes(t *testing.T, format string, b []byte, want ...string) {
	t.Helper()
	switch format {
	case "png":
		img, err := png.Decode(bytes.NewReader(b))
		if err != nil {
			t.Fatalf("not a PNG: %v", err)
		}
		if r := img.Bounds(); r.Dx() < 800 || r.Dy() < 300 {
			t.Fatalf("PNG of %v", r)
		}
	case "svg":
		dec := xml.NewDecoder(bytes.NewReader(b))
		var text strings.Builder
		for {
			tok, err := dec.Token()
			if err == io.EOF {
				break
			}
			if err != nil {
				t.Fatalf("not XML: %v", err)
			}
			if c, ok := tok.(xml.CharData); ok {
				text.Write(c)
				text.WriteByte('\n')
			}
		}
		for _, w := range want {
			if !strings.Contains(text.String(), w) {
				t.Errorf("the SVG's text lacks %q:\n%s", w, text.String())
			}
		}
	}
}

func TestTune(t *testing.T) {
	res := &iobench.TuneResult{}
	for _, b := range []string{"uring", "posix"} {
		for _, qd := range []int{4, 32} {
			for _, bs := range []int{128 << 10, 1 << 20, 4 << 20} {
				res.Rows = append(res.Rows, iobench.TuneRow{Backend: b, BlockSize: bs, QueueDepth: qd, Parallel: 1, Overlap: true,
					ReadGBps: float64(qd) / 10 * float64(bs>>17), WriteGBps: 1 + float64(bs>>20)})
			}
		}
	}
	// A stage-2 row is not drawn.
	res.Rows = append(res.Rows, iobench.TuneRow{Backend: "uring", BlockSize: 1 << 20, QueueDepth: 32, Parallel: 2, Overlap: true, ReadGBps: 99, WriteGBps: 99})
	res.Best = res.Rows[5]
	for _, f := range Formats {
		var buf bytes.Buffer
		if err := Tune(&buf, f, res, "zinf tune /nvme"); err != nil {
			t.Fatal(err)
		}
		decodes(t, f, buf.Bytes(), "zinf tune /nvme: read", "zinf tune /nvme: write", "uring qd 4", "posix qd 32", "128K", "4M", "block size", "GB/s", "best")
	}
	if err := Tune(io.Discard, "svg", &iobench.TuneResult{}, ""); err == nil {
		t.Fatal("an empty sweep drew")
	}
	if err := Tune(io.Discard, "gif", res, ""); err == nil {
		t.Fatal("a gif drew")
	}
}

func TestTimeline(t *testing.T) {
	t0 := time.Now()
	at := func(ms float64) time.Time { return t0.Add(time.Duration(ms * 1e6)) }
	var ev []trace.Event
	for step := int64(0); step < 2; step++ {
		base := float64(step) * 100
		for l := range 3 {
			ev = append(ev,
				trace.Event{Kind: trace.Wait, Step: step, Layer: int32(l), Where: "layer", Start: at(base + float64(l)*10), End: at(base + float64(l)*10 + 1)},
				trace.Event{Kind: trace.Compute, Step: step, Layer: int32(l), Where: "forward", Start: at(base + float64(l)*10 + 1), End: at(base + float64(l)*10 + 9)},
				trace.Event{Kind: trace.Read, Step: step, Where: "param", Name: "w", Bytes: 1 << 20, Start: at(base + float64(l)*10), End: at(base + float64(l)*10 + 5)},
				// Overlapping reads take lanes of their own.
				trace.Event{Kind: trace.Read, Step: step, Where: "optim", Name: "s", Bytes: 1 << 20, Start: at(base + 40), End: at(base + 60)},
				trace.Event{Kind: trace.OptUpdate, Step: step, Name: "w", SubGroup: int32(l), Start: at(base + 60 + float64(l)), End: at(base + 61 + float64(l))},
			)
		}
		ev = append(ev, trace.Event{Kind: trace.Step, Step: step, Start: at(base + 40), End: at(base + 70)}, trace.Event{Kind: trace.Compute, Rank: 1, Step: step, Where: "backward", Start: at(base), End: at(base + 1)})
	}
	if s := Steps(ev, 0); len(s) != 2 || s[0] != 1 || s[1] != 2 {
		t.Fatalf("steps %v", s)
	}
	for _, f := range Formats {
		var buf bytes.Buffer
		if err := Timeline(&buf, f, ev, 0, 2, ""); err != nil {
			t.Fatal(err)
		}
		decodes(t, f, buf.Bytes(), "zinf: rank 0, step 2", "loop", "waits", "param I/O", "optim I/O", "optimizer update", "compute (forward)", "read", "update", "ms from the step's first event")
	}
	if err := Timeline(io.Discard, "svg", ev, 0, 3, ""); err == nil || !strings.Contains(err.Error(), "[1 2]") {
		t.Fatalf("a step not in the trace: %v", err)
	}
}

func TestFormatOf(t *testing.T) {
	for in, want := range map[string]string{"a.svg": "svg", "b.PNG": "png", "/x/y.png": "png"} {
		if got, err := FormatOf(in); err != nil || got != want {
			t.Errorf("%s: %q %v", in, got, err)
		}
	}
	for _, in := range []string{"a", "a.jpg", "a.svg.gz"} {
		if _, err := FormatOf(in); err == nil || !strings.Contains(err.Error(), ".svg, .png") {
			t.Errorf("%s: %v", in, err)
		}
	}
}

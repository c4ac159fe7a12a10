package iobench

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os/exec"
	"strings"
)

// FioStats are one direction's figures of a fio run (with
// --group_reporting, the whole group's).
type FioStats struct {
	IOBytes   float64 `json:"io_bytes"`
	BwBytes   float64 `json:"bw_bytes"`
	RuntimeMs float64 `json:"runtime"`
}

// GBps is the bandwidth in GB/s (1e9 bytes per second): the bytes over
// the runtime (the slowest job's, end_fsync included) when fio reports
// both, else fio's own bw_bytes; 0 when fio reported neither.
func (s FioStats) GBps() float64 {
	if s.RuntimeMs > 0 && s.IOBytes > 0 {
		return s.IOBytes / (s.RuntimeMs / 1e3) / 1e9
	}
	return s.BwBytes / 1e9
}

// FioReport is the first job (or group) of a fio run's JSON report.
type FioReport struct {
	Read  FioStats `json:"read"`
	Write FioStats `json:"write"`
}

// RunFio runs the fio binary with args, adding --output-format=json when
// args do not set an output format, and returns the first job's (or, with
// --group_reporting, the group's) figures. A failed run's error quotes the
// command line and fio's stderr.
func RunFio(ctx context.Context, fio string, args []string) (FioReport, error) {
	hasFormat := false
	for _, a := range args {
		hasFormat = hasFormat || strings.HasPrefix(a, "--output-format=")
	}
	if !hasFormat {
		args = append(args[:len(args):len(args)], "--output-format=json")
	}
	cmd := exec.CommandContext(ctx, fio, args...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		return FioReport{}, fmt.Errorf("fio %s: %w: %s", strings.Join(args, " "), err, errb.String())
	}
	var rep struct {
		Jobs []FioReport `json:"jobs"`
	}
	// fio may print warnings before the JSON object.
	data := out.Bytes()
	if i := bytes.IndexByte(data, '{'); i > 0 {
		data = data[i:]
	}
	if err := json.Unmarshal(data, &rep); err != nil {
		return FioReport{}, fmt.Errorf("fio: unreadable JSON output (%v): %.200s", err, out.String())
	}
	if len(rep.Jobs) == 0 {
		return FioReport{}, errors.New("fio: the JSON output lists no jobs")
	}
	return rep.Jobs[0], nil
}

package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"strings"

	"github.com/zinfio/zinf/cmd/zinf/internal/doctor"
)

func init() {
	register("doctor", "report what this machine supports (io_uring, libaio, O_DIRECT, memlock, the memory a process may take, CUDA, cuFile) and the space runs that are gone left", runDoctor)
}

type multiFlag []string

func (m *multiFlag) String() string     { return strings.Join(*m, ",") }
func (m *multiFlag) Set(v string) error { *m = append(*m, v); return nil }

var _ flag.Value = (*multiFlag)(nil)

func runDoctor(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlags("doctor", stderr)
	var paths multiFlag
	var asJSON bool
	var tbw int64
	fs.Var(&paths, "path", "a swap directory to check (repeatable)")
	fs.BoolVar(&asJSON, "json", false, "print JSON")
	sizeVar(fs, &tbw, "tbw", 0, "the drives' endurance rating (bytes written over their life, e.g. 600TB): set each disk's writes since boot against it")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if tbw < 0 {
		return fmt.Errorf("--tbw %d is invalid: it must not be negative", tbw)
	}
	r := doctor.Run(paths)
	r.Endurance(paths, tbw)
	var err error
	if asJSON {
		err = json.NewEncoder(stdout).Encode(r)
	} else {
		err = r.Write(stdout)
	}
	if err != nil {
		return err
	}
	// The report is printed whole; a swap path zinf cannot use at all
	// makes the exit code non-zero so scripts notice. Stale swap space
	// does not: the next run in the path removes it.
	if bad := r.Unusable(); len(bad) > 0 {
		return fmt.Errorf("unusable swap path(s): %s", strings.Join(bad, ", "))
	}
	return nil
}

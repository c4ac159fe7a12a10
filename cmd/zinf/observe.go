package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"net"
	"os"
	"time"

	"github.com/zinfio/zinf"
	"github.com/zinfio/zinf/examples/train"
	"github.com/zinfio/zinf/metrics"
	"github.com/zinfio/zinf/trace"
)

// observeFlags are train's timeline and metrics flags.
type observeFlags struct {
	trace       string
	traceSteps  int
	metricsAddr string
	tbw         int64 // -1: the config's zinf.nvme_tbw
}

func (f *observeFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&f.trace, "trace", "", "write a timeline of the run to this new file (Chrome trace-event JSON: open it in ui.perfetto.dev or chrome://tracing; zinf timeline draws it)")
	fs.IntVar(&f.traceSteps, "trace-steps", 0, "with --trace, record the first N steps only (0: all)")
	fs.StringVar(&f.metricsAddr, "metrics-addr", "", "serve Prometheus metrics at http://ADDR/metrics while training (e.g. 127.0.0.1:9400; port 0 picks one)")
	f.tbw = -1
	fs.Var(tbwFlag{&f.tbw}, "tbw", "the NVMe drives' endurance rating (e.g. 600TB) to set the run's writes against; default: the config's zinf.nvme_tbw")
}

// tbwFlag is a size flag whose unset value (-1) means "from the config".
type tbwFlag struct{ v *int64 }

func (f tbwFlag) String() string {
	if f.v == nil || *f.v < 0 {
		return "the config's zinf.nvme_tbw"
	}
	return sizeFlag(f).String()
}

func (f tbwFlag) Set(s string) error { return sizeFlag(f).Set(s) }

// check reports bad or orphaned flags, and a --trace file that exists:
// zinf writes only files it creates.
func (f *observeFlags) check(fs *flag.FlagSet) error {
	set := map[string]bool{}
	fs.Visit(func(fl *flag.Flag) { set[fl.Name] = true })
	var errs []error
	if set["trace"] && f.trace == "" {
		errs = append(errs, errors.New("--trace \"\" is invalid: name a file to create"))
	}
	if set["trace-steps"] {
		if f.trace == "" {
			errs = append(errs, errors.New("--trace-steps needs --trace (the file to write)"))
		} else if err := intIn("--trace-steps", f.traceSteps, 0, math.MaxInt32); err != nil {
			errs = append(errs, err)
		}
	}
	if f.trace != "" {
		if _, err := os.Lstat(f.trace); err == nil {
			errs = append(errs, fmt.Errorf("--trace %s already exists: zinf writes only files it creates; choose another name or remove it", f.trace))
		}
	}
	if set["metrics-addr"] && f.metricsAddr == "" {
		errs = append(errs, errors.New("--metrics-addr \"\" is invalid: give host:port (e.g. 127.0.0.1:9400)"))
	}
	return errors.Join(errs...)
}

// allInterfaces reports whether a listen address binds every interface:
// no host (":9400"), or an unspecified one ("0.0.0.0:9400", "[::]:9400").
func allInterfaces(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false // Serve refused it already
	}
	if host == "" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsUnspecified()
}

// start opens the trace file and the metrics server as the flags say and
// hooks them into o; stop ends both (writing the end of the trace) and
// reports what was written.
func (f *observeFlags) start(o *train.Options, stderr io.Writer) (stop func() error, err error) {
	var file *os.File
	var tw *trace.ChromeWriter
	var srv *metrics.Server
	stop = func() error {
		var errs []error
		if srv != nil {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			errs = append(errs, srv.Close(ctx))
			cancel()
		}
		if tw != nil {
			errs = append(errs, tw.Close(), file.Close())
			if err := errors.Join(errs...); err == nil {
				fmt.Fprintf(stderr, "trace: %d events in %s (open it in https://ui.perfetto.dev or chrome://tracing; `zinf timeline --trace %s --out step.svg` draws a step)\n",
					tw.Events(), f.trace, f.trace)
			}
		}
		if err := errors.Join(errs...); err != nil {
			return fmt.Errorf("--trace/--metrics-addr: %w", err)
		}
		return nil
	}
	if f.trace != "" {
		file, err = os.OpenFile(f.trace, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
		if err != nil {
			return nil, fmt.Errorf("--trace: %w", err)
		}
		tw = trace.NewChromeWriter(file, trace.ChromeOptions{Steps: int64(f.traceSteps)})
		o.Trace = tw
	}
	if f.metricsAddr != "" {
		c := metrics.New()
		srv, err = metrics.Serve(f.metricsAddr, metrics.NewRegistry(c))
		if err != nil {
			stop()
			return nil, fmt.Errorf("--metrics-addr %s: %w", f.metricsAddr, err)
		}
		o.Runtimes = func(rts []*zinf.Runtime) { c.Set(rts...) }
		fmt.Fprintf(stderr, "metrics: serving http://%s/metrics\n", srv.Addr())
		if allInterfaces(f.metricsAddr) {
			fmt.Fprintf(stderr, "metrics: warning: --metrics-addr %s listens on all network interfaces: anyone who can reach this machine can read the metrics (give 127.0.0.1:PORT to serve this machine only)\n", f.metricsAddr)
		}
	}
	return stop, nil
}

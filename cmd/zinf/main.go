// Command zinf is the command line of the zinf framework: I/O benchmarks
// and tuning (io, tune), a capability report (doctor), placement plans
// (plan), the simulated training and inference examples (train, infer) and
// checkpoint tools (ckpt). Each subcommand lives in its own file; the logic
// is in importable packages.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"sort"
	"sync/atomic"
	"syscall"
	"time"
)

// command is one subcommand.
type command struct {
	summary string
	run     func(ctx context.Context, args []string, stdout, stderr io.Writer) error
}

var commands = map[string]command{}

func register(name, summary string, run func(ctx context.Context, args []string, stdout, stderr io.Writer) error) {
	commands[name] = command{summary: summary, run: run}
}

// errUsage marks an error already explained by the flag package.
var errUsage = errors.New("usage")

func usage(w io.Writer) {
	fmt.Fprintln(w, "zinf — train and serve models larger than the memory that holds them")
	fmt.Fprintln(w, "\nUsage: zinf <command> [flags]   (zinf <command> -h for a command's flags)\n\nCommands:")
	names := make([]string, 0, len(commands))
	for n := range commands {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		fmt.Fprintf(w, "  %-8s %s\n", n, commands[n].summary)
	}
}

// run is main without os.Exit, for tests: it returns the exit code.
func run(args []string, stdout, stderr io.Writer) int {
	if len(args) < 1 {
		// A usage error: the text goes where errors go.
		usage(stderr)
		return 2
	}
	if len(args) == 2 && args[0] == "help" {
		if _, ok := commands[args[1]]; ok {
			args = []string{args[1], "-h"} // zinf help io == zinf io -h
		}
	}
	if args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		usage(stdout)
		return 0
	}
	cmd, ok := commands[args[0]]
	if !ok {
		fmt.Fprintf(stderr, "zinf: unknown command %q\n\n", args[0])
		usage(stderr)
		return 2
	}
	ctx, stop := signalContext(args[0], stderr)
	defer stop()
	if err := cmd.run(ctx, args[1:], stdout, stderr); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		// A run cut short by a signal exits as a process killed by it
		// would (128 + the signal's number: 130 for SIGINT), whatever
		// error the cancellation surfaced as, so scripts can tell an
		// interruption from a failure.
		var rep reported
		if errors.As(err, &rep) {
			return 1 // the command printed it already
		}
		var se signalError
		if errors.As(context.Cause(ctx), &se) {
			fmt.Fprintf(stderr, "zinf %s: interrupted by %v\n", args[0], se.sig)
			return 128 + int(se.sig)
		}
		if !errors.Is(err, errUsage) {
			fmt.Fprintf(stderr, "zinf %s: %v\n", args[0], err)
		}
		return 1
	}
	return 0
}

// reported is an error the command has printed already (a rank of an
// MPI job says why it fails before it lingers for the others).
type reported struct{ err error }

func (r reported) Error() string { return r.err.Error() }
func (r reported) Unwrap() error { return r.err }

// signalError is the cause of a context cancelled by a signal.
type signalError struct{ sig syscall.Signal }

func (e signalError) Error() string { return "interrupted by " + e.sig.String() }

// interruptGrace is how long a command has to return on its own after
// SIGINT or SIGTERM cancelled its context. Past it, or at a second signal,
// or at once when the command is inside a blocking section (see
// beginBlocking), the process exits with 128 + the signal's number and a
// message: a wait that no context reaches (an open(2) or read(2) of a
// file that never answers) cannot keep it alive. What a run leaves then is
// what a crash leaves, which zinf is built to survive: swap files the next
// run on the path (or zinf doctor) removes, no half-committed checkpoint.
const interruptGrace = 5 * time.Second

var (
	// blocking counts the blocking sections in progress.
	blocking atomic.Int32
	// enteredBlocking wakes the signal watcher when a section begins, so
	// that a signal received just before it still ends the process.
	enteredBlocking = make(chan struct{}, 1)
)

// beginBlocking marks the start of a blocking section: the command waits
// on something no context cancels (opening and reading a file the user
// named), so a signal ends the process at once rather than cancel a
// context nobody reads. The returned func ends the section.
func beginBlocking() (end func()) {
	blocking.Add(1)
	select {
	case enteredBlocking <- struct{}{}:
	default:
	}
	return func() { blocking.Add(-1) }
}

// signalContext returns a context cancelled, with a signalError as its
// cause, on SIGINT or SIGTERM; stop releases the signals. After the first
// signal it watches the command as interruptGrace says, and ends the
// process, saying so on stderr as "zinf <name>: ...", when the command does
// not return.
func signalContext(name string, stderr io.Writer) (ctx context.Context, stop func()) {
	ctx, cancel := context.WithCancelCause(context.Background())
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	done := make(chan struct{})
	go func() {
		var sig syscall.Signal
		select {
		case s := <-sigs:
			sig = syscall.SIGINT
			if ss, ok := s.(syscall.Signal); ok {
				sig = ss
			}
			cancel(signalError{sig})
		case <-done:
			return
		}
		exit := func(why string) {
			fmt.Fprintf(stderr, "zinf %s: interrupted by %v %s; exiting now\n", name, sig, why)
			os.Exit(128 + int(sig))
		}
		if blocking.Load() > 0 {
			exit("while blocked reading a file")
		}
		timer := time.NewTimer(interruptGrace)
		defer timer.Stop()
		for {
			select {
			case <-enteredBlocking:
				if blocking.Load() > 0 {
					exit("while blocked reading a file")
				}
			case <-sigs:
				exit("again")
			case <-timer.C:
				exit(fmt.Sprintf("and still running %v later", interruptGrace))
			case <-done:
				return
			}
		}
	}()
	return ctx, func() {
		signal.Stop(sigs)
		close(done)
		cancel(nil)
	}
}

func main() { os.Exit(run(os.Args[1:], os.Stdout, os.Stderr)) }

// newFlags returns a FlagSet that reports errors to stderr and returns them.
func newFlags(name string, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet("zinf "+name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	return fs
}

// parseFlags parses args; a parse error has been printed already.
func parseFlags(fs *flag.FlagSet, args []string) error {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return errUsage
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(fs.Output(), "%s: unexpected arguments %q\n", fs.Name(), fs.Args())
		return errUsage
	}
	return nil
}

package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/zinfio/zinf/config"
	"github.com/zinfio/zinf/internal/base/memlimit"
	"github.com/zinfio/zinf/internal/base/units"
	"github.com/zinfio/zinf/plan"
)

// cliLogger is the one logger every subcommand hands to the packages it
// runs, so that their warnings look the same whichever command printed
// them: slog's text format on stderr, warnings and errors only.
// A warning repeated word for word (the same message and attributes, from
// several engines opened on one directory, say) is printed once.
func cliLogger(stderr io.Writer) *slog.Logger {
	h := slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn})
	return slog.New(&onceHandler{Handler: h, seen: &sync.Map{}})
}

// onceHandler drops records identical to one already handled.
type onceHandler struct {
	slog.Handler
	seen  *sync.Map // record key -> struct{}
	attrs string    // attributes added by WithAttrs, part of the key
}

func (h *onceHandler) Handle(ctx context.Context, r slog.Record) error {
	var b strings.Builder
	fmt.Fprintf(&b, "%s\x00%s\x00%s", r.Level, r.Message, h.attrs)
	r.Attrs(func(a slog.Attr) bool {
		fmt.Fprintf(&b, "\x00%s", a)
		return true
	})
	if _, dup := h.seen.LoadOrStore(b.String(), struct{}{}); dup {
		return nil
	}
	return h.Handler.Handle(ctx, r)
}

func (h *onceHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return &onceHandler{Handler: h.Handler.WithAttrs(as), seen: h.seen, attrs: h.attrs + fmt.Sprint(as)}
}

func (h *onceHandler) WithGroup(name string) slog.Handler {
	return &onceHandler{Handler: h.Handler.WithGroup(name), seen: h.seen, attrs: h.attrs + "/" + name}
}

// intIn checks that an integer flag lies in lo..hi, naming the flag, the
// value and the range.
func intIn(flagName string, v, lo, hi int) error {
	if v < lo || v > hi {
		return fmt.Errorf("%s %d is invalid (allowed: %d..%d)", flagName, v, lo, hi)
	}
	return nil
}

// sizeIn checks that a size flag lies in lo..hi bytes.
func sizeIn(flagName string, v, lo, hi int64) error {
	if v < lo || v > hi {
		return fmt.Errorf("%s %s is invalid (allowed: %s..%s)", flagName, sizeText(v), config.Size(lo), config.Size(hi))
	}
	return nil
}

// sizeText renders a size flag's value as the user could have written it:
// in binary units when it is a whole number of them (4GiB), else in bytes.
func sizeText(v int64) string {
	if v <= 0 || v%1024 != 0 {
		return strconv.FormatInt(v, 10)
	}
	return config.Size(v).String()
}

// maxComputeMs bounds --compute-ms-per-layer: an hour of simulated compute
// per layer is far beyond any use, and the bound keeps the conversion to a
// time.Duration from overflowing.
const maxComputeMs = 3600e3

// computeMsFlag converts --compute-ms-per-layer to a duration, refusing
// NaN, infinities, negative values and values past maxComputeMs by name
// (NaN passes every ordered comparison, so it is checked first).
func computeMsFlag(v float64) (time.Duration, error) {
	const name = "--compute-ms-per-layer"
	if math.IsNaN(v) || math.IsInf(v, 0) || v < 0 || v > maxComputeMs {
		return 0, fmt.Errorf("%s %v is invalid (allowed: a number of milliseconds from 0 to %g)", name, v, float64(maxComputeMs))
	}
	return time.Duration(v * float64(time.Millisecond)), nil
}

// noExplicitZero refuses any of the named flags set to 0 on the command
// line. Those flags leave 0 as their default to mean "derive it from the
// other flags", which the usage text says; writing 0 out is then almost
// certainly a mistake, and accepting it would make 0 mean "default" here
// while every other command rejects it.
func noExplicitZero(fs *flag.FlagSet, names ...string) error {
	var errs []error
	fs.Visit(func(f *flag.Flag) {
		for _, n := range names {
			if v := f.Value.String(); f.Name == n && (v == "0" || v == "0B") {
				errs = append(errs, fmt.Errorf("--%s 0 is invalid: it must be at least 1 (leave the flag out for the default: %s)", n, f.Usage))
			}
		}
	})
	return errors.Join(errs...)
}

// memAvailable returns what this process may still allocate, in bytes:
// the tightest of MemAvailable, the memory cgroup's limit less its usage
// and ulimit -v less the address space mapped (memlimit.Available, which
// the pinned pool checks too). ok is false when nothing can be read (then
// no check is made rather than a guess).
func memAvailable() (n int64, ok bool) {
	lim, ok := memlimit.Available()
	return lim.Bytes, ok
}

// checkMemory refuses a flag whose value needs more memory than is
// available, naming the flag, the value, what it needs and the limit.
func checkMemory(flagName string, value, need int64, what string) error {
	lim, ok := memlimit.Available()
	if !ok || need <= lim.Bytes {
		return nil
	}
	return fmt.Errorf("%s %s needs %s of memory for %s, more than the %s available (%s): choose a smaller %s",
		flagName, sizeText(value), units.FormatBytesExact(need), what, units.FormatBytesExact(lim.Bytes), lim.What, flagName)
}

// checkPinnedPools refuses zinf.tiers.cpu_pinned_bytes when the pinned
// pools of the ranks this process runs (each rank its own pool of that
// size) need more memory than the process may still take, before anything
// is built: each pool is mapped and locked whole. (zinf.Open checks one
// pool too; this check counts every rank's.)
func checkPinnedPools(cfg *config.Config, ranks int) error {
	pool := int64(cfg.Zinf.Tiers.CPUPinnedBytes)
	need := pool * int64(ranks)
	if ranks < 1 || need/int64(ranks) != pool {
		need = math.MaxInt64
	}
	lim, ok := memlimit.Available()
	if !ok || need <= lim.Bytes {
		return nil
	}
	each := ""
	if ranks > 1 {
		each = fmt.Sprintf(" for each of the %d ranks this process runs (%s in all)", ranks, units.FormatBytesExact(need))
	}
	return fmt.Errorf("zinf.tiers.cpu_pinned_bytes = %s%s is more than the %s of memory available (%s): lower zinf.tiers.cpu_pinned_bytes in the config",
		units.FormatBytesExact(pool), each, units.FormatBytesExact(lim.Bytes), lim.What)
}

// checkDisk refuses a flag whose value needs more free space in dir than
// its filesystem has, naming the flag, the value and the space free.
func checkDisk(flagName string, value, need int64, dir string) error {
	_, free, ok := diskFree(dir)
	if !ok || need <= free {
		return nil // no figure, or the path's own check reports what is wrong with it
	}
	return fmt.Errorf("%s %s needs %s on %s, more than the %s free there: choose a smaller %s or another --path",
		flagName, sizeText(value), units.FormatBytesExact(need), dir, units.FormatBytesExact(free), flagName)
}

// diskFree returns the bytes free to an unprivileged writer on the
// filesystem of the directory dir; ok is false when dir is not a directory
// or the filesystem has no block accounting (ramfs reports 0 free however
// much it can hold), where there is no figure to check.
func diskFree(dir string) (string, int64, bool) {
	var st unix.Statfs_t
	if fi, err := os.Stat(dir); err != nil || !fi.IsDir() || unix.Statfs(dir, &st) != nil || st.Blocks == 0 {
		return dir, 0, false
	}
	free := int64(st.Bavail) * int64(st.Bsize)
	if st.Bsize > 0 && int64(st.Bavail) > math.MaxInt64/int64(st.Bsize) {
		free = math.MaxInt64
	}
	return dir, free, true
}

// nextPow2 is the smallest power of two at least n (n > 0): the pinned pool
// rounds its capacity up to one.
func nextPow2(n int64) int64 {
	p := int64(1)
	for p < n && p < 1<<62 {
		p <<= 1
	}
	return p
}

// checkKVMemory refuses a KV cache whose memory (the Go heap, or pinned
// memory of its own) with the pinned pool is more than this process may
// take, as rt.OpenKVCache does once the pool is mapped.
func checkKVMemory(cfg *config.Config, kp plan.KVCache) error {
	pool := int64(cfg.Zinf.Tiers.CPUPinnedBytes)
	need := pool + kp.MemoryBytes + kp.PinnedBytes
	lim, ok := memlimit.Available()
	if !ok || kp.MemoryBytes+kp.PinnedBytes == 0 || need <= lim.Bytes {
		return nil
	}
	return fmt.Errorf("the KV cache on %s (%s) and zinf.tiers.cpu_pinned_bytes (%s) need %s, more than the %s of memory available (%s): set zinf.kv_cache.device nvme (or auto with zinf.kv_cache.bytes below the cache), or plan a shorter --kv-seq or a smaller batch",
		kp.Device, units.FormatBytesExact(kp.MemoryBytes+kp.PinnedBytes), units.FormatBytesExact(pool), units.FormatBytesExact(need), units.FormatBytesExact(lim.Bytes), lim.What)
}

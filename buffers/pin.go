package buffers

import (
	"fmt"
	"log/slog"

	"github.com/zinfio/zinf/internal/base/units"
)

// Seams for tests: root with CAP_IPC_LOCK may mlock regardless of
// RLIMIT_MEMLOCK, so the unpinned fallback is exercised by replacing these.
var (
	mlockFn        = mlockRegion
	munlockFn      = munlockRegion
	memlockLimitFn = memlockLimit
)

// raiseMemlockHint says how to let a process pin memory.
const raiseMemlockHint = "raise the memlock limit: `ulimit -l unlimited` in the launching shell, " +
	"LimitMEMLOCK=infinity in the systemd unit, `--ulimit memlock=-1` for docker, " +
	"a memlock line in /etc/security/limits.conf, or grant CAP_IPC_LOCK"

// describeMemlockLimit renders the current RLIMIT_MEMLOCK for messages.
func describeMemlockLimit() string {
	limit, unlimited, ok := memlockLimitFn()
	switch {
	case !ok:
		return "unknown"
	case unlimited:
		return "unlimited"
	}
	return formatBytes(int64(min(limit, 1<<62)))
}

// formatBytes renders n as "8 MiB (8388608 bytes)" or "512 bytes".
func formatBytes(n int64) string {
	return units.FormatBytesExact(n)
}

// pin applies the pin policy to the freshly mapped arena. Under PinAuto a
// failure is logged once, here, and the pool carries on unpinned.
func (p *Pool) pin(policy PinPolicy, logger *slog.Logger) error {
	if policy == PinOff {
		return nil
	}
	err := mlockFn(p.mem)
	if err == nil {
		p.pinned = true
		return nil
	}
	// A failed mlock may have locked a prefix; drop it so the state is clear.
	_ = munlockFn(p.mem)
	want, limit := formatBytes(int64(len(p.mem))), describeMemlockLimit()
	if policy == PinRequired {
		return fmt.Errorf("%w: mlock of the %s arena failed (%w); RLIMIT_MEMLOCK is %s; %s",
			ErrPinned, want, err, limit, raiseMemlockHint)
	}
	logger.Warn(fmt.Sprintf("buffers: cannot pin the %s host-memory arena (RLIMIT_MEMLOCK is %s: %v); "+
		"continuing with unpinned memory: device copies will be slower and pages may be swapped out; to pin, %s",
		want, limit, err, raiseMemlockHint),
		slog.Int64("wanted_bytes", int64(len(p.mem))),
		slog.String("memlock_limit", limit),
		slog.String("error", err.Error()))
	return nil
}

package scalebench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/zinfio/zinf/metrics/stats"
	"github.com/zinfio/zinf/policy"
)

// CompareOptions describe a comparison of configurations on the same model
// (Compare).
type CompareOptions struct {
	// Options are every block's; Variant is set per block.
	Options
	// Variants are the configurations compared, in the first round's
	// order. Default: Variants (fp32, then compact).
	Variants []string
	// Rounds is the number of blocks of Options.Steps steps each
	// configuration trains; the order reverses every round (A B, B A, A
	// B, ...) so that a drift of the disk over the run weighs on both.
	// Default 2.
	Rounds int
}

// Comparison is what Compare measured.
type Comparison struct {
	Rounds int `json:"rounds"`
	// StepsPerBlock is Options.Steps.
	StepsPerBlock int `json:"steps_per_block"`
	// DiskNeedBytes is the largest of the configurations' disk needs (the
	// blocks run one after the other, each removing its state before the
	// next writes its own); DiskNeedAllBytes what holding every
	// configuration's state at once would take; DiskFreeBytes what was
	// free.
	DiskNeedBytes    int64 `json:"disk_need_bytes"`
	DiskNeedAllBytes int64 `json:"disk_need_all_bytes"`
	DiskFreeBytes    int64 `json:"disk_free_bytes"`
	// Blocks are the runs in the order they ran.
	Blocks []*Result `json:"blocks"`
	// Configs sums the blocks up by configuration, in Variants' order.
	Configs []*ConfigSummary `json:"configs"`
	// Ratio is the last configuration's median step over the first's.
	Ratio   float64 `json:"median_ratio"`
	Seconds float64 `json:"seconds"`
}

// ConfigSummary is one configuration over its blocks.
type ConfigSummary struct {
	Variant    string    `json:"variant"`
	Params     int64     `json:"params"`
	StateBytes int64     `json:"state_bytes"`
	StepMs     []float64 `json:"step_ms"`
	// StepMsMedian, StepMsMin and StepMsMax are over every step of every
	// block of the configuration.
	StepMsMedian float64 `json:"step_ms_median"`
	StepMsMin    float64 `json:"step_ms_min"`
	StepMsMax    float64 `json:"step_ms_max"`
	// DiskBytesPerParam is the median of the steps' bytes (read and
	// written) per parameter at the disk, the steps after each block's
	// first (Result.DiskStepBytes); StoreBytesPerParam zinf's stores'
	// count of every step; PlanBytesPerParam the plan's (zinf.PlanModel);
	// DiskVsPlan the disk's figure against the plan's, in percent.
	DiskBytesPerParam  float64 `json:"disk_bytes_per_param"`
	StoreBytesPerParam float64 `json:"store_bytes_per_param"`
	PlanBytesPerParam  float64 `json:"plan_bytes_per_param"`
	DiskVsPlanPct      float64 `json:"disk_vs_plan_pct"`
	// PlanStepMs is the plan's predicted step (first block's bandwidth);
	// PredictedMsMedian the median of the steps' disk-bound predictions
	// (their bytes at the bandwidth measured around their block).
	PlanStepMs        float64 `json:"plan_step_ms"`
	PredictedMsMedian float64 `json:"predicted_ms_median"`
	PeakRSSBytes      int64   `json:"peak_rss_bytes"`
	SampleChecked     int64   `json:"sample_checked"`
}

// Compare trains the same model in each of o.Variants, in blocks of
// o.Steps steps that alternate (o.Rounds per configuration, the order
// reversed every round), and sums up each configuration: the median step
// with its range, and the bytes per parameter per step at the disk against
// the plan's. Each block is a Run: it measures the bandwidth before and
// after, opens the runtime, writes the initial state, trains and removes
// the state, so only one configuration's state is on the disk at a time
// (the disk a per-step alternation would need, both states at once, is
// reported as DiskNeedAllBytes).
func Compare(ctx context.Context, o CompareOptions) (*Comparison, error) {
	start := time.Now()
	o.defaults()
	if len(o.Variants) == 0 {
		o.Variants = Variants
	}
	if o.Rounds == 0 {
		o.Rounds = 2
	}
	var errs []error
	if o.Rounds < 1 || o.Rounds > 100 {
		errs = append(errs, fmt.Errorf("--rounds %d is invalid (allowed: 1..100)", o.Rounds))
	}
	for i, v := range o.Variants {
		if !slices.Contains(Variants, v) {
			errs = append(errs, fmt.Errorf("--configs %q is invalid (allowed: %s)", v, strings.Join(Variants, ", ")))
		} else if slices.Contains(o.Variants[:i], v) {
			errs = append(errs, fmt.Errorf("--configs names %q twice", v))
		}
	}
	if err := errors.Join(append(errs, o.check())...); err != nil {
		return nil, err
	}
	c := &Comparison{Rounds: o.Rounds, StepsPerBlock: o.Steps}
	// Every configuration's need, before anything is written: a block
	// refused halfway would waste the ones before it.
	spec := o.spec()
	probeFiles := o.ProbeBytes
	if o.mixed() {
		probeFiles = max(o.ProbeBytes, 2*o.MixedBytes)
	}
	for _, v := range o.Variants {
		cfg, err := VariantConfig(o.Dir, o.PoolBytes, o.Width, v)
		if err != nil {
			return nil, err
		}
		need, err := diskNeed(ctx, spec, cfg, 0, o.Logger)
		if err != nil {
			return nil, err
		}
		c.DiskNeedBytes = max(c.DiskNeedBytes, need+probeFiles)
		c.DiskNeedAllBytes += need
	}
	c.DiskNeedAllBytes += probeFiles
	var st unix.Statfs_t
	if err := unix.Statfs(o.Dir, &st); err != nil {
		return nil, fmt.Errorf("--path %s: %w", o.Dir, err)
	}
	c.DiskFreeBytes = int64(st.Bavail) * int64(st.Bsize)
	if c.DiskFreeBytes < c.DiskNeedBytes {
		return c, fmt.Errorf("%w: the largest of %s needs %s (%d bytes) free on %s; %s (%d bytes) are free: free space, choose another --path or a smaller --state",
			ErrNoSpace, strings.Join(o.Variants, ", "), policy.FormatBytes(c.DiskNeedBytes), c.DiskNeedBytes, o.Dir,
			policy.FormatBytes(c.DiskFreeBytes), c.DiskFreeBytes)
	}
	if o.Progress != nil {
		fmt.Fprintf(o.Progress, "bench-scale: %s, %d rounds of %d steps each, alternating blocks (order reversed every round); disk: %s for the largest, %s free on %s (both states at once would take %s)\n",
			strings.Join(o.Variants, " vs "), o.Rounds, o.Steps, policy.FormatBytes(c.DiskNeedBytes), policy.FormatBytes(c.DiskFreeBytes), o.Dir,
			policy.FormatBytes(c.DiskNeedAllBytes))
	}
	byVariant := map[string][]*Result{}
	for r := 0; r < o.Rounds; r++ {
		order := slices.Clone(o.Variants)
		if r%2 == 1 {
			slices.Reverse(order)
		}
		for _, v := range order {
			bo := o.Options
			bo.Variant = v
			res, err := Run(ctx, bo)
			if err != nil {
				return c, fmt.Errorf("round %d, %s: %w", r+1, v, err)
			}
			if o.Progress != nil {
				fmt.Fprintf(o.Progress, "\nround %d of %d, %s: steps %s ms", r+1, o.Rounds, v, msList(res.StepMs))
				if err := res.Write(o.Progress); err != nil {
					return c, err
				}
			}
			c.Blocks = append(c.Blocks, res)
			byVariant[v] = append(byVariant[v], res)
		}
	}
	for _, v := range o.Variants {
		c.Configs = append(c.Configs, summarize(v, byVariant[v]))
	}
	if first, last := c.Configs[0], c.Configs[len(c.Configs)-1]; first.StepMsMedian > 0 {
		c.Ratio = last.StepMsMedian / first.StepMsMedian
	}
	c.Seconds = time.Since(start).Seconds()
	return c, nil
}

// summarize sums up a configuration's blocks.
func summarize(v string, blocks []*Result) *ConfigSummary {
	s := &ConfigSummary{Variant: v}
	var disk, store, predicted []float64
	for _, b := range blocks {
		s.Params, s.StateBytes = b.Params, b.StateBytes
		s.StepMs = append(s.StepMs, b.StepMs...)
		predicted = append(predicted, b.PredictedMs...)
		for i, d := range b.DiskStepBytes {
			if i > 0 && d > 0 {
				disk = append(disk, float64(d)/float64(b.Params))
			}
		}
		for i := range b.ReadBytes {
			store = append(store, float64(b.ReadBytes[i]+b.WriteBytes[i])/float64(b.Params))
		}
		if s.PlanBytesPerParam == 0 {
			s.PlanBytesPerParam, s.PlanStepMs = b.PlanBytesPerParam(), b.PlanStepMs
		}
		s.PeakRSSBytes = max(s.PeakRSSBytes, b.PeakRSSBytes)
		s.SampleChecked += b.SampleChecked
	}
	if len(s.StepMs) > 0 {
		s.StepMsMedian, s.StepMsMin, s.StepMsMax = stats.Median(s.StepMs), slices.Min(s.StepMs), slices.Max(s.StepMs)
	}
	if len(disk) > 0 {
		s.DiskBytesPerParam = stats.Median(disk)
		if s.PlanBytesPerParam > 0 {
			s.DiskVsPlanPct = (s.DiskBytesPerParam - s.PlanBytesPerParam) / s.PlanBytesPerParam * 100
		}
	}
	if len(store) > 0 {
		s.StoreBytesPerParam = stats.Median(store)
	}
	if len(predicted) > 0 {
		s.PredictedMsMedian = stats.Median(predicted)
	}
	return s
}

func msList(ms []float64) string {
	parts := make([]string, len(ms))
	for i, m := range ms {
		parts[i] = fmt.Sprintf("%.0f", m)
	}
	return strings.Join(parts, ", ")
}

// Write prints the comparison.
func (c *Comparison) Write(w io.Writer) error {
	if len(c.Configs) == 0 {
		return nil
	}
	first := c.Configs[0]
	fmt.Fprintf(w, "\nbench-scale comparison: %d params, %d rounds of %d steps per configuration in alternating blocks\n", first.Params, c.Rounds, c.StepsPerBlock)
	fmt.Fprintf(w, "  %-8s %10s %22s %14s %12s %12s %10s %12s\n", "config", "state", "median step ms (range)", "disk B/param", "plan B/param", "disk vs plan", "zinf B/param", "plan step")
	for _, s := range c.Configs {
		disk, vs := "-", "-"
		if s.DiskBytesPerParam > 0 {
			disk, vs = fmt.Sprintf("%.2f", s.DiskBytesPerParam), fmt.Sprintf("%+.1f%%", s.DiskVsPlanPct)
		}
		fmt.Fprintf(w, "  %-8s %10s %8.0f (%.0f..%.0f) %14s %12.2f %12s %12.2f %9.0f ms\n", s.Variant, policy.FormatBytes(s.StateBytes),
			s.StepMsMedian, s.StepMsMin, s.StepMsMax, disk, s.PlanBytesPerParam, vs, s.StoreBytesPerParam, s.PlanStepMs)
	}
	last := c.Configs[len(c.Configs)-1]
	_, err := fmt.Fprintf(w, "  median step %s / %s: %.2fx\n", last.Variant, first.Variant, c.Ratio)
	return err
}

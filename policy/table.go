package policy

import (
	"bufio"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/zinfio/zinf/tensor"
)

// FormatDuration renders d for the plan table: "850 µs", "12.3 ms",
// "1.25 s"; "0" for zero.
func FormatDuration(d time.Duration) string {
	switch {
	case d <= 0:
		return "0"
	case d < time.Millisecond:
		return fmt.Sprintf("%.0f µs", float64(d)/float64(time.Microsecond))
	case d < time.Second:
		return fmt.Sprintf("%.1f ms", float64(d)/float64(time.Millisecond))
	}
	return fmt.Sprintf("%.2f s", d.Seconds())
}

func formatBandwidth(bps float64, unknown string) string {
	if bps <= 0 {
		return unknown
	}
	return FormatBytes(int64(bps)) + "/s"
}

func percent(n, of int64) string {
	if of <= 0 {
		return "-"
	}
	return fmt.Sprintf("%.1f%%", 100*float64(n)/float64(of))
}

// tierOrder is the order tiers are listed in: fastest first.
var tierOrder = []tensor.Tier{tensor.TierGPU, tensor.TierCPU, tensor.TierNVMe}

// WriteTable renders the placement for people: the tiers, what each holds
// by kind (tensors, bytes, share of the tier's capacity), the swap buffers,
// the prefetch depth, the predicted time per phase and the notes. `zinf
// plan` prints it.
func (p *Placement) WriteTable(w io.Writer) error {
	bw := bufio.NewWriter(w)
	t := p.Tiers
	var total int64
	for _, b := range p.BytesPerTier {
		total += b
	}
	fmt.Fprintf(bw, "placement: %d layers, %d tensors, %s\n", p.Layers, len(p.Tier), FormatBytes(total))
	nvme := fmt.Sprintf("%d paths", t.NVMePaths)
	if t.NVMePaths == 1 {
		nvme = "1 path"
	}
	source := ""
	if t.NVMeBandwidthSource != "" {
		source = " (" + t.NVMeBandwidthSource + ")"
	}
	fmt.Fprintf(bw, "tiers: gpu %s, cpu pinned %s, nvme %s read %s write %s%s, pcie %s\n\n",
		FormatBytes(t.GPUBytes), FormatBytes(t.CPUBytes), nvme,
		formatBandwidth(t.NVMeReadBps, "unknown"), formatBandwidth(t.NVMeWriteBps, "unknown"), source,
		formatBandwidth(t.PCIeBps, "unlimited"))

	tw := tabwriter.NewWriter(bw, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "TIER\tHOLDS\tTENSORS\tBYTES\t% OF TIER")
	for _, tier := range tierOrder {
		capacity := int64(-1)
		switch tier {
		case tensor.TierGPU:
			capacity = t.GPUBytes
		case tensor.TierCPU:
			capacity = t.CPUBytes
		}
		var used int64
		tensors := 0
		rows := 0
		for k := Kind(0); k < numKinds; k++ {
			u, ok := p.PerKind[k][tier]
			if !ok || u.Tensors == 0 {
				continue
			}
			label := k.String()
			if k == Param && tier == tensor.TierCPU && p.ParamCacheBytes > 0 {
				label = "param (max_in_cpu cache)"
			}
			fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\n", tier, label, u.Tensors, FormatBytes(u.Bytes), percent(u.Bytes, capacity))
			used += u.Bytes
			tensors += u.Tensors
			rows++
		}
		extra := func(label string, bytes int64) {
			fmt.Fprintf(tw, "%s\t%s\t-\t%s\t%s\n", tier, label, FormatBytes(bytes), percent(bytes, capacity))
			used += bytes
			rows++
		}
		switch tier {
		case tensor.TierGPU:
			if p.GPUWorkingBytes > 0 {
				extra("working set", p.GPUWorkingBytes)
			}
		case tensor.TierCPU:
			if len(p.PinnedRows) > 0 {
				for _, r := range p.PinnedRows {
					if r.Bytes > 0 {
						extra(r.What, r.Bytes)
					}
				}
				break
			}
			if p.ParamBufferCount > 0 {
				extra(fmt.Sprintf("param buffers %d x %s", p.ParamBufferCount, FormatBytes(p.ParamBufferBytes)),
					int64(p.ParamBufferCount)*p.ParamBufferBytes)
			}
			if p.OptimizerBufferCount > 0 {
				extra(fmt.Sprintf("optimizer buffers %d x %s", p.OptimizerBufferCount, FormatBytes(p.OptimizerBufferBytes)),
					int64(p.OptimizerBufferCount)*p.OptimizerBufferBytes)
			}
		}
		if rows == 0 {
			fmt.Fprintf(tw, "%s\t-\t0\t0 B\t%s\n", tier, percent(0, capacity))
			continue
		}
		fmt.Fprintf(tw, "%s\ttotal\t%d\t%s\t%s\n", tier, tensors, FormatBytes(used), percent(used, capacity))
		if tier == tensor.TierNVMe && p.NVMeDiskBytes > 0 {
			// The same tensors with the copies copy-on-write keeps
			// during a step, padded: what the swap files reach.
			fmt.Fprintf(tw, "%s\t%s\t-\t%s\t-\n", tier, "swap files (copy-on-write)", FormatBytes(p.NVMeDiskBytes))
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}

	fmt.Fprintln(bw)
	layers := "layers"
	if p.PrefetchDepth == 1 {
		layers = "layer"
	}
	switch {
	case p.ParamBufferCount > 0 && p.PrefetchDepth > 0:
		fmt.Fprintf(bw, "prefetch: %d %s ahead, at most %s fetched before use\n",
			p.PrefetchDepth, layers, FormatBytes(p.PrefetchBudgetBytes))
	case p.ParamBufferCount > 0:
		fmt.Fprintln(bw, "prefetch: none, each layer's parameters are read from NVMe when it starts")
	case p.PrefetchDepth > 0:
		fmt.Fprintf(bw, "prefetch: %d %s ahead copied to the GPU\n", p.PrefetchDepth, layers)
	default:
		fmt.Fprintln(bw, "prefetch: none")
	}
	pr := p.Predicted
	opt := "optimizer I/O " + FormatDuration(pr.OptimizerIO)
	if pr.Overlapped {
		opt = fmt.Sprintf("optimizer step %s exposed of %s, overlapping backward", FormatDuration(pr.ExposedOptimizer), FormatDuration(pr.OptimizerIO))
	}
	fmt.Fprintf(bw, "predicted step: %s (compute %s, exposed parameter I/O %s of %s, exposed gradient I/O %s of %s, %s)\n\n",
		FormatDuration(pr.Total), FormatDuration(pr.Compute),
		FormatDuration(pr.ExposedParamIO), FormatDuration(pr.ParamIO),
		FormatDuration(pr.ExposedGradIO), FormatDuration(pr.GradIO), opt)
	if p.MicroBatches > 1 {
		how := "zinf.schedule"
		if h := p.Hints.Schedule; h == "" || h == ScheduleAuto {
			how = "zinf.schedule auto: the faster prediction"
			if p.Predicted.Total > min(p.PredictedLayerMajor.Total, p.PredictedMicroBatchMajor.Total) {
				how = "zinf.schedule auto: the faster order does not fit the pinned pool"
			}
		}
		fmt.Fprintf(bw, "schedule: %s (%s), %d micro-batches per step\n", p.Schedule, how, p.MicroBatches)
		for _, o := range []struct {
			name string
			pr   StepPrediction
		}{{ScheduleLayerMajor, p.PredictedLayerMajor}, {ScheduleMicroBatchMajor, p.PredictedMicroBatchMajor}} {
			fmt.Fprintf(bw, "  %-18s predicted step %s, nvme read %s, written %s per step\n", o.name,
				FormatDuration(o.pr.Total), FormatBytes(o.pr.NVMeReadBytes), FormatBytes(o.pr.NVMeWriteBytes))
		}
		fmt.Fprintln(bw)
	}

	tw = tabwriter.NewWriter(bw, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "PHASE\tCOMPUTE\tI/O\tEXPOSED I/O\tTIME")
	for _, ph := range pr.Phases {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", ph.Name,
			FormatDuration(ph.Compute), FormatDuration(ph.IO), FormatDuration(ph.Exposed), FormatDuration(ph.Total))
	}
	fmt.Fprintf(tw, "step\t%s\t\t%s\t%s\n", FormatDuration(pr.Compute),
		FormatDuration(pr.Total-pr.Compute), FormatDuration(pr.Total))
	if err := tw.Flush(); err != nil {
		return err
	}

	if len(p.Notes) > 0 {
		fmt.Fprintln(bw, "\nnotes:")
		for _, n := range p.Notes {
			fmt.Fprintf(bw, "  - %s\n", n)
		}
	}
	return bw.Flush()
}

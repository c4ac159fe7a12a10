package main

import (
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/zinfio/zinf/swapper/optimizer"
)

// optimizerTail describes the part of a step's optimizer update that the
// backward pass did not hide: the sub-groups still in the pipeline when
// the loop committed (the commit's drain), where each stood at that
// moment, and what the pipeline spent the drain on. It reads the step's
// own timeline (optimizer.StepStats.Timeline); "" for a step without one.
func optimizerTail(s optimizer.StepStats) string {
	if len(s.Timeline) == 0 || s.Drain <= 0 {
		return ""
	}
	// The drain began when the loop called Commit: the step's end less the
	// final rename and the wait.
	at := s.Elapsed - s.Commit - s.Drain
	var stages [8]int
	var stageBytes [8]int64
	names := [8]string{"not begun", "waiting for buffers", "reading", "read, waiting for the update", "updating", "waiting for a write slot", "writing", "retiring"}
	var left int
	var leftBytes int64
	var upd, rd, wr time.Duration // the left sub-groups' update, record reads and writes after at
	byTensor := map[string]int64{}
	for _, t := range s.Timeline {
		if t.Retired > 0 && t.Retired <= at {
			continue
		}
		left++
		b := t.RecordBytes + t.GradBytes
		leftBytes += b
		byTensor[t.Tensor] += b
		i := 0
		switch {
		case t.Ahead > at || t.Ahead == 0:
			i = 0
		case t.Buffered == 0 || t.Buffered > at:
			i = 1
		case t.ReadDone == 0 || t.ReadDone > at:
			i = 2
		case t.Picked == 0 || t.Picked > at:
			i = 3
		case t.Updated == 0 || t.Updated > at:
			i = 4
		case t.WriteIssued == 0 || t.WriteIssued > at:
			i = 5
		case t.WriteDone == 0 || t.WriteDone > at:
			i = 6
		default:
			i = 7
		}
		stages[i]++
		stageBytes[i] += b
		upd += after(at, max(t.Picked, t.ReadDone), t.Updated)
		rd += after(at, t.ReadIssued, t.ReadDone)
		wr += after(at, t.WriteIssued, t.WriteDone)
	}
	var parts []string
	for i, n := range stages {
		if n > 0 {
			parts = append(parts, fmt.Sprintf("%d %s (%.0f MiB)", n, names[i], float64(stageBytes[i])/(1<<20)))
		}
	}
	type tb struct {
		name  string
		bytes int64
	}
	var ts []tb
	for n, b := range byTensor {
		ts = append(ts, tb{n, b})
	}
	sort.Slice(ts, func(i, j int) bool {
		return ts[i].bytes > ts[j].bytes || ts[i].bytes == ts[j].bytes && ts[i].name < ts[j].name
	})
	var top []string
	for i, t := range ts {
		if i == 3 {
			top = append(top, fmt.Sprintf("%d more", len(ts)-3))
			break
		}
		top = append(top, fmt.Sprintf("%s %.0f MiB", t.name, float64(t.bytes)/(1<<20)))
	}
	return fmt.Sprintf("optimizer tail: the commit waited %.2f s for %d of %d sub-groups (%.0f MiB of records and gradients): %s; tensors %s; after the commit began, their updates took %.2f s, record reads in flight %.2f s, writes %.2f s (summed over sub-groups); the step's update compute %.1f s, waits read %.1f / write %.1f / idle %.1f s, I/O gaps %.2f s",
		s.Drain.Seconds(), left, len(s.Timeline), float64(leftBytes)/(1<<20), strings.Join(parts, ", "), strings.Join(top, ", "),
		upd.Seconds(), rd.Seconds(), wr.Seconds(), s.Compute.Seconds(), s.ReadWait.Seconds(), s.WriteWait.Seconds(), s.Idle.Seconds(), s.IOGaps.Seconds())
}

// after is the part of a timeline span [from, to) past at; 0 for a span
// whose stage was not reached (a zero offset).
func after(at, from, to time.Duration) time.Duration {
	if from <= 0 || to <= 0 {
		return 0
	}
	return max(0, to-max(from, at))
}

package plots

import (
	"fmt"
	"image/color"
	"io"
	"slices"
	"time"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"

	"github.com/zinfio/zinf/trace"
)

// track is one row group of the timeline, in the order drawn (top first).
type track struct {
	name  string
	match func(e *trace.Event) bool
}

var tracks = []track{
	{"loop", func(e *trace.Event) bool {
		return e.Kind == trace.Compute || e.Kind == trace.Step || e.Kind == trace.Rollback
	}},
	{"waits", func(e *trace.Event) bool { return e.Kind == trace.Wait }},
	{"optimizer read", func(e *trace.Event) bool { return e.Kind == trace.OptRead }},
	{"optimizer update", func(e *trace.Event) bool { return e.Kind == trace.OptUpdate }},
	{"optimizer write", func(e *trace.Event) bool { return e.Kind == trace.OptWrite }},
	{"param I/O", func(e *trace.Event) bool { return isIO(e) && e.Where == "param" }},
	{"grad I/O", func(e *trace.Event) bool { return isIO(e) && e.Where == "grad" }},
	{"optim I/O", func(e *trace.Event) bool { return isIO(e) && e.Where == "optim" }},
}

func isIO(e *trace.Event) bool { return e.Kind == trace.Read || e.Kind == trace.Write }

// style is how a kind of span is drawn and named in the legend.
type style struct {
	label string
	color color.RGBA
}

func styleOf(e *trace.Event) style {
	switch e.Kind {
	case trace.Compute:
		if e.Where == "backward" {
			return style{"compute (backward)", palette[0]}
		}
		return style{"compute (forward)", palette[4]}
	case trace.Step:
		return style{"optimizer step (loop waits)", color.RGBA{0x99, 0x99, 0x99, 0xff}}
	case trace.Rollback:
		return style{"rollback", palette[7]}
	case trace.Wait:
		return style{"wait", palette[5]}
	case trace.Read, trace.OptRead:
		return style{"read", palette[2]}
	case trace.Write, trace.OptWrite:
		return style{"write", palette[1]}
	case trace.OptUpdate:
		return style{"update", palette[3]}
	}
	return style{e.Kind.String(), palette[6]}
}

// maxLanes bounds the rows one track gets; more overlapping spans share
// its last row.
const maxLanes = 6

// bar is one span on the chart, in milliseconds from the window's start.
type bar struct {
	x0, x1, y0, y1 float64
	c              color.RGBA
}

// bars is a plot.Plotter drawing filled rectangles.
type bars []bar

func (b bars) Plot(c draw.Canvas, p *plot.Plot) {
	trX, trY := p.Transforms(&c)
	for _, r := range b {
		x0, x1 := trX(r.x0), trX(r.x1)
		switch {
		case x1-x0 < vg.Points(0.6):
			x1 = x0 + vg.Points(0.6) // a span too short to see still shows
		case x1-x0 > vg.Points(2):
			x1 -= vg.Points(0.5) // a hairline between spans that touch
		}
		pts := []vg.Point{{X: x0, Y: trY(r.y0)}, {X: x1, Y: trY(r.y0)}, {X: x1, Y: trY(r.y1)}, {X: x0, Y: trY(r.y1)}}
		c.FillPolygon(r.c, c.ClipPolygonXY(pts))
	}
}

func (b bars) DataRange() (xmin, xmax, ymin, ymax float64) {
	if len(b) == 0 {
		return 0, 1, 0, 1
	}
	xmin, ymin = b[0].x0, b[0].y0
	xmax, ymax = b[0].x1, b[0].y1
	for _, r := range b {
		xmin, xmax = min(xmin, r.x0), max(xmax, r.x1)
		ymin, ymax = min(ymin, r.y0), max(ymax, r.y1)
	}
	return xmin, xmax, ymin, ymax
}

// Steps lists the steps (numbered from 1) that rank has events of.
func Steps(events []trace.Event, rank int32) []int64 {
	var out []int64
	for _, e := range events {
		if e.Rank == rank && !slices.Contains(out, e.Step+1) {
			out = append(out, e.Step+1)
		}
	}
	slices.Sort(out)
	return out
}

// Timeline draws step (numbered from 1, as the trace's args say) of rank
// from a trace's events: a row group per track (the loop's compute and
// steps, its waits, the optimizer's stages, each store's I/O), spans that
// overlap on separate rows, time in milliseconds from the step's first
// event. format is "svg" or "png".
func Timeline(w io.Writer, format string, events []trace.Event, rank int32, step int64, title string) error {
	var sel []trace.Event
	for _, e := range events {
		if e.Rank == rank && e.Step == step-1 {
			sel = append(sel, e)
		}
	}
	if len(sel) == 0 {
		return fmt.Errorf("plots: the trace has no events of rank %d step %d (steps of rank %d: %v)", rank, step, rank, Steps(events, rank))
	}
	slices.SortFunc(sel, func(a, b trace.Event) int { return a.Start.Compare(b.Start) })
	t0 := sel[0].Start
	ms := func(t time.Time) float64 { return float64(t.Sub(t0)) / 1e6 }
	var bs bars
	var ticks []plot.Tick
	legend := map[string]color.RGBA{}
	var order []string
	y := 0.0
	for _, tr := range tracks {
		var lanes []time.Time // each lane's last end
		var in []trace.Event
		for _, e := range sel {
			if tr.match(&e) {
				in = append(in, e)
			}
		}
		if len(in) == 0 {
			continue
		}
		placed := make([]int, len(in))
		for i, e := range in {
			li := -1
			for l, end := range lanes {
				if !e.Start.Before(end) {
					li = l
					break
				}
			}
			if li < 0 {
				if len(lanes) < maxLanes {
					lanes = append(lanes, time.Time{})
				}
				li = len(lanes) - 1
			}
			if e.End.After(lanes[li]) {
				lanes[li] = e.End
			}
			placed[i] = li
		}
		// Lanes stack downwards from the track's top row.
		top := y
		for i, e := range in {
			st := styleOf(&e)
			row := top - float64(placed[i])
			bs = append(bs, bar{x0: ms(e.Start), x1: ms(e.End), y0: row - 0.8, y1: row, c: st.color})
			if _, ok := legend[st.label]; !ok {
				legend[st.label] = st.color
				order = append(order, st.label)
			}
		}
		ticks = append(ticks, plot.Tick{Value: top - 0.4, Label: tr.name})
		y = top - float64(len(lanes)) - 0.5
	}
	p := plot.New()
	p.Title.Text = title
	if p.Title.Text == "" {
		p.Title.Text = fmt.Sprintf("zinf: rank %d, step %d", rank, step)
	}
	p.X.Label.Text = "ms from the step's first event"
	p.Y.Tick.Marker = plot.ConstantTicks(ticks)
	p.Add(plotter.NewGrid())
	p.Add(bs)
	p.Y.Min, p.Y.Max = y, 0.3
	for _, label := range order {
		c := legend[label]
		p.Legend.Add(label, swatch{c})
	}
	rows := -y
	h := vg.Length(rows)*0.22*vg.Inch + 1.6*vg.Inch
	return render(w, format, 12*vg.Inch, h, [][]*plot.Plot{{p}})
}

// swatch is a legend thumbnail: a filled box.
type swatch struct{ c color.RGBA }

func (s swatch) Thumbnail(c *draw.Canvas) {
	c.FillPolygon(s.c, []vg.Point{{X: c.Min.X, Y: c.Min.Y}, {X: c.Max.X, Y: c.Min.Y}, {X: c.Max.X, Y: c.Max.Y}, {X: c.Min.X, Y: c.Max.Y}})
}

package plots

import (
	"fmt"
	"io"
	"slices"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"

	"github.com/zinfio/zinf/cmd/zinf/internal/iobench"
)

// Tune draws a sweep's block size x queue depth grid (its first stage:
// one worker, batched submits, overlapped events): read and write GB/s
// against block size, a line per backend and queue depth (color for the
// depth, dashes for the backend), the best configuration starred when it
// is in that grid. format is "svg" or "png".
func Tune(w io.Writer, format string, res *iobench.TuneResult, title string) error {
	type key struct {
		backend string
		qd      int
	}
	seen := map[key]bool{}
	var keys []key
	var depths, sizes []int
	var backends []string
	for _, r := range res.Rows {
		if r.Parallel != 1 || r.SingleSubmit || !r.Overlap {
			continue
		}
		if k := (key{r.Backend, r.QueueDepth}); !seen[k] {
			seen[k] = true
			keys = append(keys, k)
		}
		if !slices.Contains(depths, r.QueueDepth) {
			depths = append(depths, r.QueueDepth)
		}
		if !slices.Contains(sizes, r.BlockSize) {
			sizes = append(sizes, r.BlockSize)
		}
		if !slices.Contains(backends, r.Backend) {
			backends = append(backends, r.Backend)
		}
	}
	if len(keys) == 0 {
		return fmt.Errorf("plots: the sweep has no rows to draw")
	}
	slices.Sort(depths)
	slices.Sort(sizes)
	var ticks []plot.Tick
	for _, s := range sizes {
		ticks = append(ticks, plot.Tick{Value: float64(s), Label: sizeLabel(s)})
	}
	panel := func(op string, gbps func(iobench.TuneRow) float64) (*plot.Plot, error) {
		p := plot.New()
		p.Title.Text = op
		p.X.Label.Text = "block size"
		p.Y.Label.Text = "GB/s"
		p.X.Scale = plot.LogScale{}
		p.X.Tick.Marker = plot.ConstantTicks(ticks)
		p.Y.Min = 0
		p.Add(plotter.NewGrid())
		for _, k := range keys {
			var xys plotter.XYs
			for _, r := range res.Rows {
				if r.Backend == k.backend && r.QueueDepth == k.qd && r.Parallel == 1 && !r.SingleSubmit && r.Overlap {
					xys = append(xys, plotter.XY{X: float64(r.BlockSize), Y: gbps(r)})
				}
			}
			slices.SortFunc(xys, func(a, b plotter.XY) int { return int(a.X - b.X) })
			l, pts, err := plotter.NewLinePoints(xys)
			if err != nil {
				return nil, err
			}
			c := palette[slices.Index(depths, k.qd)%len(palette)]
			l.Color, pts.Color = c, c
			l.Width = vg.Points(1.5)
			if bi := slices.Index(backends, k.backend); bi > 0 {
				l.Dashes = [][]vg.Length{nil, {vg.Points(6), vg.Points(3)}, {vg.Points(2), vg.Points(2)}}[bi%3]
			}
			pts.Shape = draw.CircleGlyph{}
			pts.Radius = vg.Points(2)
			p.Add(l, pts)
			p.Legend.Add(fmt.Sprintf("%s qd %d", k.backend, k.qd), l, pts)
		}
		b := res.Best
		if b.Parallel == 1 && !b.SingleSubmit && b.Overlap && b.BlockSize > 0 {
			s, err := plotter.NewScatter(plotter.XYs{{X: float64(b.BlockSize), Y: gbps(b)}})
			if err != nil {
				return nil, err
			}
			s.Shape = draw.PyramidGlyph{}
			s.Radius = vg.Points(6)
			s.Color = palette[7]
			p.Add(s)
			p.Legend.Add("best (read x write)", s)
		}
		return p, nil
	}
	r, err := panel("read", func(r iobench.TuneRow) float64 { return r.ReadGBps })
	if err != nil {
		return err
	}
	wr, err := panel("write", func(r iobench.TuneRow) float64 { return r.WriteGBps })
	if err != nil {
		return err
	}
	if title != "" {
		r.Title.Text = title + ": read"
		wr.Title.Text = title + ": write"
	}
	// One y range for both, so the panels compare at a glance.
	top := max(r.Y.Max, wr.Y.Max)
	r.Y.Max, wr.Y.Max = top*1.15, top*1.15
	return render(w, format, 12*vg.Inch, 4.5*vg.Inch, [][]*plot.Plot{{r, wr}})
}

func sizeLabel(n int) string {
	switch {
	case n >= 1<<20 && n%(1<<20) == 0:
		return fmt.Sprintf("%dM", n>>20)
	case n >= 1<<10 && n%(1<<10) == 0:
		return fmt.Sprintf("%dK", n>>10)
	}
	return fmt.Sprint(n)
}

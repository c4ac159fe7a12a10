// Package plots draws zinf's pictures with gonum.org/v1/plot: a tune
// sweep's bandwidth (zinf tune --plot) and one step of a trace's timeline
// (zinf timeline). It is the only package that imports the plotting
// library, so nothing else in zinf depends on it.
package plots

import (
	"fmt"
	"image/color"
	"io"
	"path/filepath"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
	"gonum.org/v1/plot/vg/vgsvg"
)

// Formats are the picture formats, by file extension.
var Formats = []string{"svg", "png"}

// FormatOf returns the format a file name asks for by its extension.
func FormatOf(path string) (string, error) {
	ext := strings.ToLower(strings.TrimPrefix(filepath.Ext(path), "."))
	for _, f := range Formats {
		if ext == f {
			return f, nil
		}
	}
	return "", fmt.Errorf("%q: the picture format comes from the extension (allowed: .%s)", path, strings.Join(Formats, ", ."))
}

// legendWidth is the strip on the right that holds the legend, so that it
// never covers data.
const legendWidth = 2.4 * vg.Inch

// render draws the plots in a grid of tiles on a canvas of w x h, the
// first plot's legend in a strip on the right, and writes it to out as
// format.
func render(out io.Writer, format string, w, h vg.Length, plots [][]*plot.Plot) error {
	var c vg.CanvasWriterTo
	switch format {
	case "svg":
		c = vgsvg.New(w, h)
	case "png":
		c = vgimg.PngCanvas{Canvas: vgimg.NewWith(vgimg.UseWH(w, h), vgimg.UseDPI(110))}
	default:
		return fmt.Errorf("plots: format %q (allowed: %s)", format, strings.Join(Formats, ", "))
	}
	dc := draw.New(c)
	main := draw.Crop(dc, 0, -legendWidth, 0, 0)
	tiles := draw.Tiles{Rows: len(plots), Cols: len(plots[0]), PadX: vg.Millimeter * 6, PadY: vg.Millimeter * 6,
		PadTop: vg.Millimeter * 2, PadBottom: vg.Millimeter * 2, PadLeft: vg.Millimeter * 2, PadRight: vg.Millimeter * 2}
	canvases := plot.Align(plots, tiles, main)
	legend := plots[0][0].Legend
	for i, row := range plots {
		for j, p := range row {
			p.Legend = plot.NewLegend() // drawn once, beside the plots
			p.Draw(canvases[i][j])
		}
	}
	legend.Top, legend.Left = true, true
	legend.YOffs = -vg.Millimeter * 8
	legend.Draw(draw.Crop(dc, w-legendWidth, 0, 0, 0))
	_, err := c.WriteTo(out)
	return err
}

// palette is a qualitative color set that stays apart in print and for
// the common color vision deficiencies (Okabe and Ito's eight).
var palette = []color.RGBA{
	{0x00, 0x72, 0xb2, 0xff}, // blue
	{0xe6, 0x9f, 0x00, 0xff}, // orange
	{0x00, 0x9e, 0x73, 0xff}, // bluish green
	{0xcc, 0x79, 0xa7, 0xff}, // reddish purple
	{0x56, 0xb4, 0xe9, 0xff}, // sky blue
	{0xd5, 0x5e, 0x00, 0xff}, // vermillion
	{0xf0, 0xe4, 0x42, 0xff}, // yellow
	{0x00, 0x00, 0x00, 0xff}, // black
}

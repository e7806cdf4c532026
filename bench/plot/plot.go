// Package plot draws line charts as standalone SVG 1.1 documents.
//
// It serves the bench suite: admitted rate over time, one line per mode,
// with outages shaded and the ideal rate drawn as a dashed reference line.
// The output opens in any browser and depends only on the input: equal
// charts give byte-identical files. It uses the standard library alone, so
// that the bench, which is part of the core module, adds nothing to the
// dependencies of the limiter's users (bench/README.md says why no plotting
// library is used).
package plot

import (
	"encoding/xml"
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"
)

// Point is one sample of a Series: T is seconds since the start of the run
// and V a rate in requests per second. A point whose T or V is NaN or
// infinite is skipped (magnitudes beyond 1e300 count as infinite).
type Point struct {
	T, V float64
}

// Series is one line of a Chart: a name for the legend and its points.
//
// The points need not be sorted: the line is drawn in order of T (a stable
// sort, so points with equal T keep their order). A Series with no finite
// point gets a legend entry but no line; one with a single point is drawn
// as a dot.
type Series struct {
	Name   string
	Points []Point
}

// Span is a shaded interval of the time axis, such as a Redis outage, with
// a label written at its top. From and To may come in either order. An
// infinite end reaches the edge of the axis (To = +Inf for an outage that
// never ended); a NaN end drops the Span.
type Span struct {
	From, To float64
	Label    string
}

// HLine is a dashed horizontal reference line, such as the ideal rate, with
// a label at its right end. An HLine whose Y is NaN or infinite is skipped.
type HLine struct {
	Y     float64
	Label string
}

// Chart is a line chart of rates over time. Its zero value is an empty
// 900 x 450 chart with axes from 0 to 1.
//
// The y axis always includes 0, every finite point and every HLine; the x
// axis covers every finite point and the finite ends of every Span. Both
// axes end on "nice" ticks (steps of 1, 2 or 5 times a power of ten).
//
// Series are coloured in order from the Okabe-Ito colour-blind-safe
// palette; past its eight colours the colours repeat with a dash pattern.
// The legend, one entry per series, sits right of the plot area so that it
// never hides a line; labels of spans and reference lines are written
// inside the plot area, over the lines, on a pale background.
//
// Many points are thinned per pixel column of the plot area: of a run of
// consecutive points (in order of T) that fall in one column only the
// lowest and the highest are kept, in their original order, so the line
// keeps its min/max envelope and has at most two points per column. A
// million points make a file of tens of kilobytes.
type Chart struct {
	Title  string // above the plot; "" means none
	XLabel string // under the x axis; "" means none
	YLabel string // beside the y axis; "" means none

	Series []Series // drawn in order, the last one on top
	Spans  []Span   // shaded under the lines
	Lines  []HLine  // dashed reference lines, under the series

	Width  int // in pixels; 0 (or less) means 900
	Height int // in pixels; 0 (or less) means 450
}

const (
	defaultWidth  = 900
	defaultHeight = 450

	fontSize    = 12
	charWidth   = 7.0 // estimated width of one character at fontSize, in pixels
	titleSize   = 16
	legendRow   = 20.0 // height of one legend entry
	legendLine  = 24.0 // length of the line sample in a legend entry
	spanLabelDy = 14.0 // height of one row of span labels
	tickLen     = 5.0
	minPlotSize = 20.0 // smallest plot area, however small the chart
)

// palette is the Okabe-Ito palette, black and yellow last: black is close
// to the axes and yellow is faint on white.
var palette = [...]string{
	"#0072B2", // blue
	"#D55E00", // vermillion
	"#009E73", // bluish green
	"#E69F00", // orange
	"#CC79A7", // reddish purple
	"#56B4E9", // sky blue
	"#000000", // black
	"#F0E442", // yellow
}

// dashes tells apart series that share a colour: the first len(palette)
// series are solid, the next ones dashed, and so on.
var dashes = [...]string{"", "8 4", "2 3", "8 3 2 3"}

// WriteSVG writes c to w as a standalone SVG 1.1 document. It returns only
// the error of writing to w, and writes with a single call to w.
//
// WriteSVG does not modify c, so it is safe to call concurrently as long as
// nothing modifies the Chart or its slices meanwhile.
func (c Chart) WriteSVG(w io.Writer) error {
	var b svgBuilder
	c.render(&b)
	_, err := io.WriteString(w, b.String())
	return err
}

// frame is the geometry of a chart: its size, the plot area inside the
// margins and the data ranges the axes show.
type frame struct {
	w, h                     float64
	left, top, right, bottom float64 // edges of the plot area, in pixels
	x0, x1, y0, y1           float64 // data range of the axes
	xTicks, yTicks           []float64
	xStep, yStep             float64
}

func (f *frame) px(x float64) float64 {
	return f.left + (x-f.x0)/(f.x1-f.x0)*(f.right-f.left)
}

func (f *frame) py(y float64) float64 {
	return f.bottom - (y-f.y0)/(f.y1-f.y0)*(f.bottom-f.top)
}

// extent is a running minimum and maximum.
type extent struct {
	lo, hi float64
	ok     bool
}

func (e *extent) add(v float64) {
	if !finite(v) {
		return
	}
	if !e.ok {
		e.lo, e.hi, e.ok = v, v, true
		return
	}
	e.lo = min(e.lo, v)
	e.hi = max(e.hi, v)
}

// maxValue bounds the values a chart can show: beyond it the arithmetic of
// the axes would overflow, so larger magnitudes count as infinite.
const maxValue = 1e300

// finite reports whether v can be plotted.
func finite(v float64) bool {
	return math.Abs(v) <= maxValue // false for NaN too
}

// layout works out the margins, the plot area and the axis ticks.
func (c *Chart) layout() frame {
	f := frame{w: defaultWidth, h: defaultHeight}
	if c.Width > 0 {
		f.w = float64(c.Width)
	}
	if c.Height > 0 {
		f.h = float64(c.Height)
	}

	var xs, ys extent
	ys.add(0)
	for _, s := range c.Series {
		for _, p := range s.Points {
			if finite(p.T) && finite(p.V) {
				xs.add(p.T)
				ys.add(p.V)
			}
		}
	}
	for _, sp := range c.Spans {
		if !math.IsNaN(sp.From) && !math.IsNaN(sp.To) {
			xs.add(sp.From)
			xs.add(sp.To)
		}
	}
	for _, l := range c.Lines {
		ys.add(l.Y)
	}
	if !xs.ok {
		xs = extent{lo: 0, hi: 1, ok: true}
	}
	if ys.lo == ys.hi {
		ys.hi = 1 // only zeros: show 0..1
	}

	f.top = 16
	if c.Title != "" {
		f.top = 40
	}
	f.bottom = f.h - (fontSize + tickLen + 14)
	if c.XLabel != "" {
		f.bottom -= fontSize + 10
	}
	if f.bottom-f.top < minPlotSize {
		f.bottom = f.top + minPlotSize
	}

	// The y ticks depend only on the height; their labels set the left margin.
	f.yTicks, f.yStep = fitTicks(ys.lo, ys.hi, f.bottom-f.top, fontSize*3, false)
	f.y0, f.y1 = f.yTicks[0], f.yTicks[len(f.yTicks)-1]
	widest := 0
	for _, s := range tickLabels(f.yTicks, f.yStep) {
		widest = max(widest, utf8.RuneCountInString(s))
	}
	f.left = 12 + tickLen + float64(widest)*charWidth
	if c.YLabel != "" {
		f.left += fontSize + 12
	}

	// The legend sits right of the plot, so it never hides a line.
	right := 24.0
	if len(c.Series) > 0 {
		widest := 0
		for _, s := range c.Series {
			widest = max(widest, utf8.RuneCountInString(s.Name))
		}
		right = max(right, 16+legendLine+6+float64(widest)*charWidth+12)
		right = min(right, f.w/3)
	}
	f.right = f.w - right
	if f.right-f.left < minPlotSize {
		f.right = f.left + minPlotSize
	}

	f.xTicks, f.xStep = fitTicks(xs.lo, xs.hi, f.right-f.left, 0, true)
	f.x0, f.x1 = f.xTicks[0], f.xTicks[len(f.xTicks)-1]
	return f
}

// spanLabels returns the spans that are drawn, with their ends in order.
func (c *Chart) spanLabels() []Span {
	var spans []Span
	for _, sp := range c.Spans {
		if math.IsNaN(sp.From) || math.IsNaN(sp.To) {
			continue
		}
		if sp.From > sp.To {
			sp.From, sp.To = sp.To, sp.From
		}
		spans = append(spans, sp)
	}
	return spans
}

func (c *Chart) render(b *svgBuilder) {
	f := c.layout()

	b.printf(`<?xml version="1.0" encoding="UTF-8" standalone="no"?>` + "\n")
	b.printf(`<svg xmlns="http://www.w3.org/2000/svg" version="1.1" width="%d" height="%d" viewBox="0 0 %d %d" font-family="Helvetica, Arial, sans-serif" font-size="%d">`+"\n",
		int(f.w), int(f.h), int(f.w), int(f.h), fontSize)
	if c.Title != "" {
		b.printf("<title>%s</title>\n", esc(c.Title))
	}
	b.printf(`<rect width="%d" height="%d" fill="#ffffff"/>`+"\n", int(f.w), int(f.h))
	if c.Title != "" {
		b.printf(`<text class="title" x="%s" y="24" text-anchor="middle" font-size="%d" font-weight="bold">%s</text>`+"\n",
			num((f.left+f.right)/2), titleSize, esc(c.Title))
	}

	c.renderSpans(b, &f)
	renderGrid(b, &f)
	c.renderAxes(b, &f) // under the series: a line at 0 stays visible
	c.renderLines(b, &f)
	c.renderSeries(b, &f)
	c.renderLabels(b, &f)
	c.renderLegend(b, &f)
	b.printf("</svg>\n")
}

func (c *Chart) renderSpans(b *svgBuilder, f *frame) {
	spans := c.spanLabels()
	if len(spans) == 0 {
		return
	}
	b.printf(`<g class="spans" fill="#888888" fill-opacity="0.18">` + "\n")
	for _, sp := range spans {
		x0, x1 := f.spanX(sp)
		b.printf(`<rect class="span" x="%s" y="%s" width="%s" height="%s"/>`+"\n",
			num(x0), num(f.top), num(x1-x0), num(f.bottom-f.top))
	}
	b.printf("</g>\n")
}

// spanX returns the left and right edge of sp in pixels, clipped to the
// plot area. The ends of sp must be in order.
func (f *frame) spanX(sp Span) (x0, x1 float64) {
	clamp := func(x float64) float64 { return min(max(x, f.x0), f.x1) }
	return f.px(clamp(sp.From)), f.px(clamp(sp.To))
}

// renderLabels writes the labels of the spans and reference lines, over
// the series and on a pale background so that both stay readable.
func (c *Chart) renderLabels(b *svgBuilder, f *frame) {
	b.printf(`<g class="labels" fill="#333333">` + "\n")
	var placed []box
	// A span label that would overlap the one before goes one row lower.
	var rowEnds []float64
	for _, sp := range c.spanLabels() {
		if sp.Label == "" {
			continue
		}
		x0, _ := f.spanX(sp)
		tx := x0 + 4
		row := 0
		for row < len(rowEnds) && rowEnds[row] > tx-6 {
			row++
		}
		if row == len(rowEnds) {
			rowEnds = append(rowEnds, 0)
		}
		rowEnds[row] = tx + textWidth(sp.Label)
		placed = append(placed, label(b, "span-label", tx, f.top+spanLabelDy+float64(row)*spanLabelDy, "start", sp.Label))
	}
	for _, l := range c.Lines {
		if !finite(l.Y) || l.Label == "" {
			continue
		}
		// Above the line if there is room in the plot area and no other
		// label there, else below it if there is.
		y := f.py(l.Y)
		above, below := y-5, y+fontSize+3
		aboveFits := above-fontSize >= f.top
		aboveFree := aboveFits && !overlaps(labelBox(f.right-4, above, "end", l.Label), placed)
		belowFree := below+4 <= f.bottom && !overlaps(labelBox(f.right-4, below, "end", l.Label), placed)
		ty := above
		if !aboveFree && (belowFree || !aboveFits) {
			ty = below
		}
		placed = append(placed, label(b, "hline-label", f.right-4, ty, "end", l.Label))
	}
	b.printf("</g>\n")
}

func renderGrid(b *svgBuilder, f *frame) {
	b.printf(`<g class="grid" stroke="#e0e0e0" stroke-width="1">` + "\n")
	for _, t := range f.yTicks {
		y := f.py(t)
		b.printf(`<line x1="%s" y1="%s" x2="%s" y2="%s"/>`+"\n", num(f.left), num(y), num(f.right), num(y))
	}
	for _, t := range f.xTicks {
		x := f.px(t)
		b.printf(`<line x1="%s" y1="%s" x2="%s" y2="%s"/>`+"\n", num(x), num(f.top), num(x), num(f.bottom))
	}
	b.printf("</g>\n")
	if f.y0 < 0 && f.y1 > 0 {
		y := f.py(0)
		b.printf(`<line class="zero" x1="%s" y1="%s" x2="%s" y2="%s" stroke="#999999" stroke-width="1"/>`+"\n",
			num(f.left), num(y), num(f.right), num(y))
	}
}

func (c *Chart) renderLines(b *svgBuilder, f *frame) {
	if len(c.Lines) == 0 {
		return
	}
	b.printf(`<g class="hlines">` + "\n")
	for _, l := range c.Lines {
		if !finite(l.Y) {
			continue
		}
		y := f.py(l.Y)
		b.printf(`<line class="hline" x1="%s" y1="%s" x2="%s" y2="%s" stroke="#555555" stroke-width="1.25" stroke-dasharray="6 4"/>`+"\n",
			num(f.left), num(y), num(f.right), num(y))
	}
	b.printf("</g>\n")
}

// style returns the colour and dash pattern of the i-th series.
func style(i int) (colour, dash string) {
	return palette[i%len(palette)], dashes[i/len(palette)%len(dashes)]
}

func (c *Chart) renderSeries(b *svgBuilder, f *frame) {
	for i, s := range c.Series {
		colour, dash := style(i)
		b.printf(`<g class="series" fill="none" stroke="%s" stroke-width="1.75" stroke-linejoin="round" stroke-linecap="round"`, colour)
		if dash != "" {
			b.printf(` stroke-dasharray="%s"`, dash)
		}
		b.printf(">\n<title>%s</title>\n", esc(s.Name))
		pts := thin(s.Points, f)
		if len(pts) > 0 {
			b.printf(`<path d="`)
			for j, p := range pts {
				if j == 0 {
					b.printf("M")
				} else {
					b.printf("L")
				}
				b.printf("%s %s", num(p.T), num(p.V))
			}
			b.printf(`"/>` + "\n")
		}
		if len(pts) == 1 {
			b.printf(`<circle cx="%s" cy="%s" r="3" fill="%s" stroke="none"/>`+"\n", num(pts[0].T), num(pts[0].V), colour)
		}
		b.printf("</g>\n")
	}
}

// thin returns the finite points of a series in pixel coordinates, in
// order of T, keeping of each run of points in one pixel column only the
// lowest and the highest.
func thin(points []Point, f *frame) []Point {
	var pts []Point
	sorted := true
	for _, p := range points {
		if !finite(p.T) || !finite(p.V) {
			continue
		}
		if len(pts) > 0 && p.T < pts[len(pts)-1].T {
			sorted = false
		}
		pts = append(pts, p)
	}
	if !sorted {
		slices.SortStableFunc(pts, func(a, b Point) int {
			switch {
			case a.T < b.T:
				return -1
			case a.T > b.T:
				return 1
			}
			return 0
		})
	}
	out := pts[:0] // overwrites pts behind the reader
	for i := 0; i < len(pts); {
		col := math.Floor(f.px(pts[i].T))
		lo, hi := i, i
		j := i + 1
		for ; j < len(pts) && math.Floor(f.px(pts[j].T)) == col; j++ {
			if pts[j].V < pts[lo].V {
				lo = j
			}
			if pts[j].V > pts[hi].V {
				hi = j
			}
		}
		first, second := pts[min(lo, hi)], pts[max(lo, hi)]
		out = append(out, Point{f.px(first.T), f.py(first.V)})
		if lo != hi {
			out = append(out, Point{f.px(second.T), f.py(second.V)})
		}
		i = j
	}
	return out
}

func (c *Chart) renderAxes(b *svgBuilder, f *frame) {
	b.printf(`<g class="axes" stroke="#333333" stroke-width="1">` + "\n")
	b.printf(`<line x1="%s" y1="%s" x2="%s" y2="%s"/>`+"\n", num(f.left), num(f.bottom), num(f.right), num(f.bottom))
	b.printf(`<line x1="%s" y1="%s" x2="%s" y2="%s"/>`+"\n", num(f.left), num(f.top), num(f.left), num(f.bottom))
	for _, t := range f.xTicks {
		x := f.px(t)
		b.printf(`<line x1="%s" y1="%s" x2="%s" y2="%s"/>`+"\n", num(x), num(f.bottom), num(x), num(f.bottom+tickLen))
	}
	for _, t := range f.yTicks {
		y := f.py(t)
		b.printf(`<line x1="%s" y1="%s" x2="%s" y2="%s"/>`+"\n", num(f.left-tickLen), num(y), num(f.left), num(y))
	}
	b.printf("</g>\n")

	b.printf(`<g class="x-ticks" text-anchor="middle" fill="#333333">` + "\n")
	for i, s := range tickLabels(f.xTicks, f.xStep) {
		b.printf(`<text x="%s" y="%s">%s</text>`+"\n", num(f.px(f.xTicks[i])), num(f.bottom+tickLen+fontSize+2), esc(s))
	}
	b.printf("</g>\n")
	b.printf(`<g class="y-ticks" text-anchor="end" fill="#333333">` + "\n")
	for i, s := range tickLabels(f.yTicks, f.yStep) {
		b.printf(`<text x="%s" y="%s">%s</text>`+"\n", num(f.left-tickLen-3), num(f.py(f.yTicks[i])+4), esc(s))
	}
	b.printf("</g>\n")

	if c.XLabel != "" {
		b.printf(`<text class="x-label" x="%s" y="%s" text-anchor="middle" fill="#333333">%s</text>`+"\n",
			num((f.left+f.right)/2), num(f.h-10), esc(c.XLabel))
	}
	if c.YLabel != "" {
		x, y := num(16), num((f.top+f.bottom)/2)
		b.printf(`<text class="y-label" x="%s" y="%s" text-anchor="middle" fill="#333333" transform="rotate(-90 %s %s)">%s</text>`+"\n",
			x, y, x, y, esc(c.YLabel))
	}
}

func (c *Chart) renderLegend(b *svgBuilder, f *frame) {
	if len(c.Series) == 0 {
		return
	}
	x := f.right + 16
	b.printf(`<g class="legend">` + "\n")
	for i, s := range c.Series {
		colour, dash := style(i)
		y := f.top + 8 + float64(i)*legendRow
		b.printf(`<g class="legend-entry">` + "\n")
		b.printf(`<line x1="%s" y1="%s" x2="%s" y2="%s" stroke="%s" stroke-width="2.5"`,
			num(x), num(y), num(x+legendLine), num(y), colour)
		if dash != "" {
			b.printf(` stroke-dasharray="%s"`, dash)
		}
		b.printf("/>\n")
		b.printf(`<text x="%s" y="%s" fill="#222222">%s</text>`+"\n", num(x+legendLine+6), num(y+4), esc(s.Name))
		b.printf("</g>\n")
	}
	b.printf("</g>\n")
}

// svgBuilder collects the document so that WriteSVG writes it at once.
type svgBuilder struct {
	strings.Builder
}

func (b *svgBuilder) printf(format string, args ...any) {
	fmt.Fprintf(&b.Builder, format, args...)
}

// num formats a coordinate with at most one decimal.
func num(v float64) string {
	s := strconv.FormatFloat(v, 'f', 1, 64)
	s = strings.TrimSuffix(s, ".0")
	if s == "-0" {
		s = "0"
	}
	return s
}

// esc escapes s for use as XML character data or an attribute value.
func esc(s string) string {
	var b strings.Builder
	_ = xml.EscapeText(&b, []byte(s)) // a strings.Builder does not fail
	return b.String()
}

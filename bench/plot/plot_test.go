package plot

import (
	"bytes"
	"encoding/xml"
	"errors"
	"io"
	"math"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// node is an element of a parsed SVG document.
type node struct {
	name     string
	attrs    map[string]string
	text     string // character data directly inside the element
	children []*node
}

func (n *node) attr(name string) string { return n.attrs[name] }

// all returns n and every element under it, in document order, for which
// keep returns true.
func (n *node) all(keep func(*node) bool) []*node {
	var out []*node
	if keep(n) {
		out = append(out, n)
	}
	for _, c := range n.children {
		out = append(out, c.all(keep)...)
	}
	return out
}

func (n *node) byName(name string) []*node {
	return n.all(func(m *node) bool { return m.name == name })
}

func (n *node) byClass(class string) []*node {
	return n.all(func(m *node) bool { return m.attr("class") == class })
}

// parse checks that doc is well-formed XML with one root element and
// returns that root.
func parse(t *testing.T, doc []byte) *node {
	t.Helper()
	d := xml.NewDecoder(bytes.NewReader(doc))
	var root *node
	var stack []*node
	for {
		tok, err := d.Token()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("xml: %v\n%s", err, doc)
		}
		switch tok := tok.(type) {
		case xml.StartElement:
			n := &node{name: tok.Name.Local, attrs: map[string]string{}}
			for _, a := range tok.Attr {
				n.attrs[a.Name.Local] = a.Value
			}
			if len(stack) > 0 {
				parent := stack[len(stack)-1]
				parent.children = append(parent.children, n)
			} else if root != nil {
				t.Fatalf("second root element <%s>", n.name)
			} else {
				root = n
			}
			stack = append(stack, n)
		case xml.EndElement:
			stack = stack[:len(stack)-1]
		case xml.CharData:
			if len(stack) > 0 {
				stack[len(stack)-1].text += string(tok)
			}
		}
	}
	if root == nil || root.name != "svg" {
		t.Fatalf("root element = %v, want <svg>", root)
	}
	return root
}

func render(t *testing.T, c Chart) []byte {
	t.Helper()
	var buf bytes.Buffer
	if err := c.WriteSVG(&buf); err != nil {
		t.Fatalf("WriteSVG: %v", err)
	}
	return buf.Bytes()
}

func num64(t *testing.T, s string) float64 {
	t.Helper()
	v, err := strconv.ParseFloat(s, 64)
	if err != nil {
		t.Fatalf("number %q: %v", s, err)
	}
	return v
}

// pathPoints returns the number of points in a path's d attribute.
func pathPoints(d string) int {
	return strings.Count(d, "M") + strings.Count(d, "L")
}

func ramp(n int, f func(i int) float64) []Point {
	pts := make([]Point, n)
	for i := range pts {
		pts[i] = Point{T: float64(i), V: f(i)}
	}
	return pts
}

func TestWriteSVGParses(t *testing.T) {
	nan, inf := math.NaN(), math.Inf(1)
	tests := []struct {
		name  string
		chart Chart
	}{
		{"zero", Chart{}},
		{"empty series", Chart{Series: []Series{{Name: "empty"}}}},
		{"single point", Chart{Series: []Series{{Name: "one", Points: []Point{{T: 5, V: 7}}}}}},
		{"all zero", Chart{Series: []Series{{Name: "z", Points: ramp(10, func(int) float64 { return 0 })}}}},
		{"only NaN", Chart{Series: []Series{{Name: "n", Points: []Point{{nan, nan}, {inf, 1}, {1, -inf}}}}}},
		{"negative", Chart{Series: []Series{{Name: "neg", Points: ramp(10, func(i int) float64 { return float64(i*10 - 50) })}}}},
		{"huge values", Chart{Series: []Series{{Name: "big", Points: []Point{{0, -math.MaxFloat64}, {1, math.MaxFloat64}}}}}},
		{"tiny range", Chart{Series: []Series{{Name: "tiny", Points: []Point{{0, 1e-300}, {1e-300, 2e-300}}}}}},
		{"tiny chart", Chart{Width: 10, Height: 10, Title: "t", XLabel: "x", YLabel: "y",
			Series: []Series{{Name: "a long series name", Points: ramp(100, func(i int) float64 { return float64(i) })}}}},
		{"escaping", Chart{Title: `<"&'>`, XLabel: "a&b", YLabel: "c<d",
			Series: []Series{{Name: "x\x00y\xff]]>"}},
			Spans:  []Span{{From: 1, To: 2, Label: "</text>"}},
			Lines:  []HLine{{Y: 1, Label: "&amp;"}}}},
		{"odd spans and lines", Chart{
			Spans: []Span{{From: 5, To: 2, Label: "reversed"}, {From: 3, To: inf, Label: "open"}, {From: nan, To: 1, Label: "dropped"}, {From: 1e308, To: math.MaxFloat64, Label: "far"}, {From: -1e308, To: 1}},
			Lines: []HLine{{Y: nan, Label: "dropped"}, {Y: -inf}, {Y: 3}}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			doc := render(t, tt.chart)
			parse(t, doc)
			for _, bad := range []string{"NaN", "Inf"} {
				if bytes.Contains(doc, []byte(bad)) {
					t.Errorf("output contains %q:\n%s", bad, doc)
				}
			}
		})
	}
}

func TestDefaultSize(t *testing.T) {
	tests := []struct {
		name          string
		width, height int
		wantW, wantH  string
		wantViewBox   string
	}{
		{name: "zero", wantW: "900", wantH: "450", wantViewBox: "0 0 900 450"},
		{name: "negative", width: -1, height: -1, wantW: "900", wantH: "450", wantViewBox: "0 0 900 450"},
		{name: "set", width: 640, height: 300, wantW: "640", wantH: "300", wantViewBox: "0 0 640 300"},
		{name: "width only", width: 640, wantW: "640", wantH: "450", wantViewBox: "0 0 640 450"},
	}
	for _, tt := range tests {
		root := parse(t, render(t, Chart{Width: tt.width, Height: tt.height}))
		if got := root.attr("width"); got != tt.wantW {
			t.Errorf("%s: width = %q, want %q", tt.name, got, tt.wantW)
		}
		if got := root.attr("height"); got != tt.wantH {
			t.Errorf("%s: height = %q, want %q", tt.name, got, tt.wantH)
		}
		if got := root.attr("viewBox"); got != tt.wantViewBox {
			t.Errorf("%s: viewBox = %q, want %q", tt.name, got, tt.wantViewBox)
		}
	}
}

func TestSeriesPaths(t *testing.T) {
	c := Chart{Series: []Series{
		{Name: "empty"},
		{Name: "one", Points: []Point{{1, 1}}},
		{Name: "line", Points: ramp(20, func(i int) float64 { return float64(i % 3) })},
		{Name: "only NaN", Points: []Point{{math.NaN(), 1}}},
	}}
	root := parse(t, render(t, c))
	groups := root.byClass("series")
	if len(groups) != len(c.Series) {
		t.Fatalf("series groups = %d, want %d", len(groups), len(c.Series))
	}
	wantPaths := []int{0, 1, 1, 0}
	wantCircles := []int{0, 1, 0, 0}
	for i, g := range groups {
		if got := len(g.byName("path")) + len(g.byName("polyline")); got != wantPaths[i] {
			t.Errorf("series %q: %d paths, want %d", c.Series[i].Name, got, wantPaths[i])
		}
		if got := len(g.byName("circle")); got != wantCircles[i] {
			t.Errorf("series %q: %d circles, want %d", c.Series[i].Name, got, wantCircles[i])
		}
		if got := g.byName("title"); len(got) != 1 || got[0].text != c.Series[i].Name {
			t.Errorf("series %d: title = %v, want %q", i, got, c.Series[i].Name)
		}
	}
	if got := len(root.byName("path")); got != 2 {
		t.Errorf("paths in document = %d, want 2", got)
	}
}

func TestSeriesStyles(t *testing.T) {
	var c Chart
	for i := range 2*len(palette) + 1 {
		c.Series = append(c.Series, Series{Name: strconv.Itoa(i), Points: ramp(3, func(int) float64 { return float64(i) })})
	}
	root := parse(t, render(t, c))
	groups := root.byClass("series")
	type key struct{ stroke, dash string }
	seen := map[key]int{}
	for i, g := range groups {
		k := key{g.attr("stroke"), g.attr("stroke-dasharray")}
		if j, dup := seen[k]; dup {
			t.Errorf("series %d and %d both drawn with %+v", j, i, k)
		}
		seen[k] = i
	}
	for i := range palette {
		if got := groups[i].attr("stroke-dasharray"); got != "" {
			t.Errorf("series %d: stroke-dasharray = %q, want solid", i, got)
		}
	}
}

func TestLegend(t *testing.T) {
	names := []string{"local", "a<b&c", `"quoted" 'single'`, "rate ≤ 5 req/s", ""}
	var c Chart
	for _, name := range names {
		c.Series = append(c.Series, Series{Name: name, Points: ramp(5, func(i int) float64 { return float64(i) })})
	}
	root := parse(t, render(t, c))
	legends := root.byClass("legend")
	if len(legends) != 1 {
		t.Fatalf("legends = %d, want 1", len(legends))
	}
	var got []string
	for _, e := range legends[0].byClass("legend-entry") {
		texts := e.byName("text")
		if len(texts) != 1 {
			t.Fatalf("legend entry has %d texts, want 1", len(texts))
		}
		got = append(got, texts[0].text)
	}
	if !slices.Equal(got, names) {
		t.Errorf("legend = %q, want %q", got, names)
	}

	if root := parse(t, render(t, Chart{})); len(root.byClass("legend")) != 0 {
		t.Errorf("chart without series has a legend")
	}
}

// xAxis returns the pixel position of the x ticks labelled lo and hi.
func xAxis(t *testing.T, root *node, lo, hi string) (float64, float64) {
	t.Helper()
	var x0, x1 float64
	var found int
	for _, g := range root.byClass("x-ticks") {
		for _, txt := range g.byName("text") {
			switch txt.text {
			case lo:
				x0 = num64(t, txt.attr("x"))
				found++
			case hi:
				x1 = num64(t, txt.attr("x"))
				found++
			}
		}
	}
	if found != 2 {
		t.Fatalf("x tick labels %q and %q: found %d, want 2", lo, hi, found)
	}
	return x0, x1
}

func TestSpanRect(t *testing.T) {
	tests := []struct {
		span           Span
		wantLo, wantHi float64 // in data units, on an axis from 0 to 100
	}{
		{Span{From: 20, To: 50, Label: "Redis down"}, 20, 50},
		{Span{From: 50, To: 20}, 20, 50},
		{Span{From: 90, To: math.Inf(1)}, 90, 100},
		{Span{From: math.Inf(-1), To: 0}, 0, 0},
		{Span{From: 40, To: 40}, 40, 40},
	}
	for _, tt := range tests {
		c := Chart{
			Series: []Series{{Name: "s", Points: ramp(101, func(i int) float64 { return float64(i) })}},
			Spans:  []Span{tt.span},
		}
		root := parse(t, render(t, c))
		left, right := xAxis(t, root, "0", "100")
		rects := root.byClass("span")
		if len(rects) != 1 {
			t.Fatalf("%+v: %d span rects, want 1", tt.span, len(rects))
		}
		x := num64(t, rects[0].attr("x"))
		w := num64(t, rects[0].attr("width"))
		wantX := left + tt.wantLo/100*(right-left)
		wantW := (tt.wantHi - tt.wantLo) / 100 * (right - left)
		if math.Abs(x-wantX) > 0.11 || math.Abs(w-wantW) > 0.11 {
			t.Errorf("%+v: rect x, width = %v, %v, want %v, %v", tt.span, x, w, wantX, wantW)
		}
	}
}

func TestSpanLabels(t *testing.T) {
	c := Chart{
		Series: []Series{{Name: "s", Points: ramp(101, func(i int) float64 { return float64(i) })}},
		Spans:  []Span{{From: 10, To: 11, Label: "first outage"}, {From: 12, To: 13, Label: "second"}, {From: 60, To: 70, Label: "third"}, {From: 80, To: 90}},
	}
	root := parse(t, render(t, c))
	labels := root.byClass("span-label")
	if len(labels) != 3 {
		t.Fatalf("span labels = %d, want 3", len(labels))
	}
	ys := []float64{num64(t, labels[0].attr("y")), num64(t, labels[1].attr("y")), num64(t, labels[2].attr("y"))}
	if ys[1] <= ys[0] {
		t.Errorf("overlapping span labels at y %v and %v, want the second lower", ys[0], ys[1])
	}
	if ys[2] != ys[0] {
		t.Errorf("span label far from the others at y %v, want the first row %v", ys[2], ys[0])
	}
}

func TestHLines(t *testing.T) {
	c := Chart{
		Series: []Series{{Name: "s", Points: ramp(10, func(int) float64 { return 50 })}},
		Lines:  []HLine{{Y: 120, Label: "ideal"}, {Y: math.NaN(), Label: "skipped"}, {Y: 30}},
	}
	root := parse(t, render(t, c))
	lines := root.byClass("hline")
	if len(lines) != 2 {
		t.Fatalf("hlines = %d, want 2", len(lines))
	}
	for _, l := range lines {
		if l.attr("stroke-dasharray") == "" {
			t.Errorf("hline at y %s is not dashed", l.attr("y1"))
		}
	}
	labels := root.byClass("hline-label")
	if len(labels) != 1 || labels[0].text != "ideal" {
		t.Errorf("hline labels = %v, want one \"ideal\"", labels)
	}
	// The y axis reaches the line at 120, above the data.
	var top string
	for _, g := range root.byClass("y-ticks") {
		texts := g.byName("text")
		top = texts[len(texts)-1].text
	}
	if got := num64(t, top); got < 120 {
		t.Errorf("top y tick = %v, want at least 120", got)
	}
}

func TestHLineLabelPlacement(t *testing.T) {
	tests := []struct {
		name      string
		y         float64
		spans     []Span
		wantAbove bool
	}{
		{"free", 50, nil, true},
		{"at the top", 100, nil, false},
		{"under a span label", 95, []Span{{From: 90, To: 100, Label: "Redis down"}}, false},
		{"span without label", 95, []Span{{From: 90, To: 100}}, true},
	}
	for _, tt := range tests {
		c := Chart{
			Series: []Series{{Name: "s", Points: ramp(101, func(i int) float64 { return float64(i) })}},
			Spans:  tt.spans,
			Lines:  []HLine{{Y: tt.y, Label: "ideal"}},
		}
		root := parse(t, render(t, c))
		line := root.byClass("hline")[0]
		labels := root.byClass("hline-label")
		if len(labels) != 1 {
			t.Fatalf("%s: hline labels = %d, want 1", tt.name, len(labels))
		}
		lineY, labelY := num64(t, line.attr("y1")), num64(t, labels[0].attr("y"))
		if got := labelY < lineY; got != tt.wantAbove {
			t.Errorf("%s: label at y %v, line at y %v: above = %v, want %v", tt.name, labelY, lineY, got, tt.wantAbove)
		}
	}
}

func TestNegativeValues(t *testing.T) {
	c := Chart{Series: []Series{{Name: "s", Points: ramp(10, func(i int) float64 { return float64(i*20 - 70) })}}}
	root := parse(t, render(t, c))
	var labels []string
	for _, g := range root.byClass("y-ticks") {
		for _, txt := range g.byName("text") {
			labels = append(labels, txt.text)
		}
	}
	if len(labels) < 2 {
		t.Fatalf("y tick labels = %q, want several", labels)
	}
	if lo := num64(t, labels[0]); lo > -70 {
		t.Errorf("lowest y tick = %v, want at most -70", lo)
	}
	if hi := num64(t, labels[len(labels)-1]); hi < 110 {
		t.Errorf("highest y tick = %v, want at least 110", hi)
	}
	if !slices.Contains(labels, "0") {
		t.Errorf("y tick labels = %q, want one at 0", labels)
	}
	if len(root.byClass("zero")) != 1 {
		t.Errorf("no line at y = 0")
	}
}

func TestNaNSkipped(t *testing.T) {
	nan, inf := math.NaN(), math.Inf(1)
	c := Chart{Series: []Series{{Name: "s", Points: []Point{
		{0, 1}, {1, nan}, {2, inf}, {nan, 3}, {-inf, 3}, {3, -inf}, {4, 2}, {5, 4},
	}}}}
	doc := render(t, c)
	root := parse(t, doc)
	paths := root.byName("path")
	if len(paths) != 1 {
		t.Fatalf("paths = %d, want 1", len(paths))
	}
	if got := pathPoints(paths[0].attr("d")); got != 3 {
		t.Errorf("path points = %d, want 3 (the finite ones): %s", got, paths[0].attr("d"))
	}
}

func TestUnsortedPoints(t *testing.T) {
	sorted := Chart{Series: []Series{{Name: "s", Points: []Point{{0, 1}, {1, 5}, {2, 3}, {3, 4}}}}}
	shuffled := Chart{Series: []Series{{Name: "s", Points: []Point{{2, 3}, {0, 1}, {3, 4}, {1, 5}}}}}
	if got, want := render(t, shuffled), render(t, sorted); !bytes.Equal(got, want) {
		t.Errorf("unsorted points:\n%s\nwant as sorted:\n%s", got, want)
	}
}

func TestManyPoints(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	const n = 1_000_000
	pts := make([]Point, n)
	for i := range pts {
		pts[i] = Point{T: float64(i) / 1000, V: 1000 + rng.NormFloat64()*100}
	}
	c := Chart{Series: []Series{{Name: "noisy", Points: pts}}}
	doc := render(t, c)
	if len(doc) > 200_000 {
		t.Errorf("%d points: %d bytes, want at most 200000", n, len(doc))
	}
	root := parse(t, doc)
	paths := root.byName("path")
	if len(paths) != 1 {
		t.Fatalf("paths = %d, want 1", len(paths))
	}
	width := num64(t, root.attr("width"))
	if got := pathPoints(paths[0].attr("d")); got > 2*int(width) {
		t.Errorf("path points = %d, want at most 2 per pixel column (%d)", got, 2*int(width))
	}
}

func TestThinKeepsEnvelope(t *testing.T) {
	// Many points in few pixel columns: each column keeps its lowest and
	// highest value, so the extremes of the data survive.
	pts := ramp(100_000, func(i int) float64 { return float64(i % 1000) })
	pts[51_234].V = -500
	pts[77_777].V = 5000
	c := Chart{Series: []Series{{Name: "s", Points: pts}}}
	f := c.layout()
	out := thin(pts, &f)
	lo, hi := math.Inf(1), math.Inf(-1)
	for _, p := range out {
		lo, hi = min(lo, p.V), max(hi, p.V)
	}
	if got, want := lo, f.py(5000); math.Abs(got-want) > 1e-9 {
		t.Errorf("highest thinned point at pixel y %v, want %v", got, want)
	}
	if got, want := hi, f.py(-500); math.Abs(got-want) > 1e-9 {
		t.Errorf("lowest thinned point at pixel y %v, want %v", got, want)
	}
	for i := 1; i < len(out); i++ {
		if out[i].T < out[i-1].T {
			t.Fatalf("thinned point %d at x %v before point %d at x %v", i, out[i].T, i-1, out[i-1].T)
		}
	}
}

func TestDeterministic(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	var c Chart
	c.Title = "same"
	for s := range 10 {
		pts := make([]Point, 5000)
		for i := range pts {
			pts[i] = Point{T: rng.Float64() * 100, V: rng.NormFloat64() * float64(s+1)}
		}
		c.Series = append(c.Series, Series{Name: "s" + strconv.Itoa(s), Points: pts})
	}
	c.Spans = []Span{{From: 10, To: 20, Label: "a"}, {From: 15, To: 30, Label: "b"}}
	c.Lines = []HLine{{Y: 3, Label: "ideal"}}
	first, second := render(t, c), render(t, c)
	if !bytes.Equal(first, second) {
		t.Errorf("two calls gave different output (%d and %d bytes)", len(first), len(second))
	}
}

type failWriter struct{ err error }

func (w failWriter) Write([]byte) (int, error) { return 0, w.err }

func TestWriteError(t *testing.T) {
	want := errors.New("disk full")
	if got := (Chart{}).WriteSVG(failWriter{want}); !errors.Is(got, want) {
		t.Errorf("WriteSVG to a failing writer = %v, want %v", got, want)
	}
}

func TestNiceTicks(t *testing.T) {
	tests := []struct {
		lo, hi   float64
		n        int
		want     []float64
		wantStep float64
	}{
		{0, 97, 5, []float64{0, 20, 40, 60, 80, 100}, 20},
		{0, 100, 5, []float64{0, 20, 40, 60, 80, 100}, 20},
		{0.3, 0.7, 5, []float64{0.3, 0.4, 0.5, 0.6, 0.7}, 0.1},
		{0.31, 0.69, 5, []float64{0.3, 0.4, 0.5, 0.6, 0.7}, 0.1},
		{0, 1, 5, []float64{0, 0.2, 0.4, 0.6, 0.8, 1}, 0.2},
		{0, 10, 5, []float64{0, 2, 4, 6, 8, 10}, 2},
		{0, 7, 5, []float64{0, 2, 4, 6, 8}, 2},
		{0, 1200, 5, []float64{0, 500, 1000, 1500}, 500},
		{-3, 7, 5, []float64{-4, -2, 0, 2, 4, 6, 8}, 2},
		{-50, 0, 5, []float64{-50, -40, -30, -20, -10, 0}, 10},
		{0, 0.001, 5, []float64{0, 0.0002, 0.0004, 0.0006, 0.0008, 0.001}, 0.0002},
		{0, 1e6, 5, []float64{0, 2e5, 4e5, 6e5, 8e5, 1e6}, 2e5},
		{97, 0, 5, []float64{0, 20, 40, 60, 80, 100}, 20},
		{0, 0, 5, []float64{-1, -0.5, 0, 0.5, 1}, 0.5},
		{5, 5, 5, []float64{4.4, 4.6, 4.8, 5, 5.2, 5.4, 5.6}, 0.2},
		{0, 97, 2, []float64{0, 50, 100}, 50},
		{0, 97, 0, []float64{0, 100}, 100},
		{math.NaN(), 1, 5, []float64{0, 1}, 1},
		{0, math.Inf(1), 5, []float64{0, 1}, 1},
	}
	for _, tt := range tests {
		got, step := niceTicks(tt.lo, tt.hi, tt.n)
		if !slices.Equal(got, tt.want) || step != tt.wantStep {
			t.Errorf("niceTicks(%v, %v, %d) = %v, %v, want %v, %v", tt.lo, tt.hi, tt.n, got, step, tt.want, tt.wantStep)
		}
	}
}

func TestNiceTicksCover(t *testing.T) {
	// Whatever the range, the ticks cover it in few evenly spaced steps.
	rng := rand.New(rand.NewPCG(5, 6))
	for range 10_000 {
		scale := math.Pow10(rng.IntN(20) - 10)
		lo := (rng.Float64()*2 - 1) * scale
		hi := lo + rng.Float64()*scale
		n := 2 + rng.IntN(8)
		ticks, step := niceTicks(lo, hi, n)
		if ticks[0] > lo || ticks[len(ticks)-1] < hi {
			t.Fatalf("niceTicks(%v, %v, %d) = %v, want them to cover the range", lo, hi, n, ticks)
		}
		if len(ticks) > 2*n+3 {
			t.Fatalf("niceTicks(%v, %v, %d) = %d ticks, want about %d", lo, hi, n, len(ticks), n+1)
		}
		for i := 1; i < len(ticks); i++ {
			if d := ticks[i] - ticks[i-1]; math.Abs(d-step) > step*1e-6 {
				t.Fatalf("niceTicks(%v, %v, %d) = %v, gap %v, want %v", lo, hi, n, ticks, d, step)
			}
		}
	}
}

func TestTickLabels(t *testing.T) {
	tests := []struct {
		ticks []float64
		step  float64
		want  []string
	}{
		{[]float64{0, 20, 40}, 20, []string{"0", "20", "40"}},
		{[]float64{0.3, 0.4, 0.5}, 0.1, []string{"0.3", "0.4", "0.5"}},
		{[]float64{-0.5, 0, 0.5}, 0.5, []string{"-0.5", "0", "0.5"}},
		{[]float64{0, 0.0002, 0.0004}, 0.0002, []string{"0", "0.0002", "0.0004"}},
		{[]float64{0, 5000, 10000}, 5000, []string{"0", "5k", "10k"}},
		{[]float64{0, 2500, 5000, 7500, 10000}, 2500, []string{"0", "2.5k", "5k", "7.5k", "10k"}},
		{[]float64{0, 2e5, 4e5}, 2e5, []string{"0", "200k", "400k"}},
		{[]float64{0, 5e6, 1e7}, 5e6, []string{"0", "5M", "10M"}},
		{[]float64{0, 1e15}, 1e15, []string{"0", "1e+15"}},
	}
	for _, tt := range tests {
		if got := tickLabels(tt.ticks, tt.step); !slices.Equal(got, tt.want) {
			t.Errorf("tickLabels(%v, %v) = %q, want %q", tt.ticks, tt.step, got, tt.want)
		}
	}
}

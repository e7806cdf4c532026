package plot_test

import (
	"bytes"
	"fmt"
	"strings"

	"github.com/hybridlimit/hybrid/bench/plot"
)

func ExampleChart_WriteSVG() {
	c := plot.Chart{
		Title:  "Admitted rate",
		XLabel: "time (s)",
		YLabel: "requests/s",
		Series: []plot.Series{
			{Name: "local", Points: []plot.Point{{T: 0, V: 95}, {T: 1, V: 210}, {T: 2, V: 190}, {T: 3, V: 100}}},
			{Name: "hybrid", Points: []plot.Point{{T: 0, V: 98}, {T: 1, V: 104}, {T: 2, V: 101}, {T: 3, V: 99}}},
		},
		Spans: []plot.Span{{From: 1, To: 2, Label: "Redis down"}},
		Lines: []plot.HLine{{Y: 100, Label: "limit"}},
	}
	var buf bytes.Buffer
	if err := c.WriteSVG(&buf); err != nil {
		panic(err)
	}
	first, _, _ := strings.Cut(buf.String(), "\n")
	fmt.Println(first)
	// Output:
	// <?xml version="1.0" encoding="UTF-8" standalone="no"?>
}

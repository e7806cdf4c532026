package bench

import (
	"bytes"
	"encoding/xml"
	"strings"
	"testing"
)

func TestChart(t *testing.T) {
	sc := Scenario{Keys: 1, Rate: 100, Cost: 2}
	reports := []Report{
		{Mode: Lease, Timeline: []Sample{{At: 1, Admitted: 50}, {At: 2, Admitted: 50}, {At: 2.5, Admitted: 25}}},
		{Mode: Local, Timeline: []Sample{{At: 1, Admitted: 400}}},
	}
	c := Chart(sc, reports)
	if len(c.Series) != 2 || c.Series[0].Name != Lease || c.Series[1].Name != Local {
		t.Fatalf("series %+v, want lease then local", c.Series)
	}
	// 50 decisions of cost 2 in one second: 100 tokens/s; 25 in half a second: 100.
	for i, p := range c.Series[0].Points {
		if p.V != 100 {
			t.Errorf("lease point %d = %+v, want 100 tokens/s", i, p)
		}
	}
	if len(c.Lines) != 1 || c.Lines[0].Y != 100 {
		t.Errorf("reference lines %+v, want the limit at 100", c.Lines)
	}
	var buf bytes.Buffer
	if err := c.WriteSVG(&buf); err != nil {
		t.Fatal(err)
	}
	if err := xml.Unmarshal(buf.Bytes(), new(struct{})); err != nil {
		t.Fatalf("the chart is not XML: %v", err)
	}
	if !strings.Contains(buf.String(), ">lease<") {
		t.Error("the chart has no legend entry for lease")
	}
}

package plot

import "unicode/utf8"

// box is the rectangle a label takes, in pixels.
type box struct{ x0, y0, x1, y1 float64 }

func overlaps(r box, others []box) bool {
	for _, o := range others {
		if r.x0 < o.x1 && o.x0 < r.x1 && r.y0 < o.y1 && o.y0 < r.y1 {
			return true
		}
	}
	return false
}

// labelBox returns the estimated rectangle of text with its baseline at
// (x, y) and the given text-anchor ("start" or "end").
func labelBox(x, y float64, anchor, text string) box {
	w := textWidth(text)
	x0 := x - 2
	if anchor == "end" {
		x0 = x - w - 2
	}
	return box{x0, y - fontSize + 1, x0 + w + 4, y + 4}
}

// label writes text with its baseline at (x, y) on a translucent white
// rectangle of its estimated size, and returns that rectangle.
func label(b *svgBuilder, class string, x, y float64, anchor, text string) box {
	r := labelBox(x, y, anchor, text)
	b.printf(`<rect class="label-bg" x="%s" y="%s" width="%s" height="%s" fill="#ffffff" fill-opacity="0.8"/>`+"\n",
		num(r.x0), num(r.y0), num(r.x1-r.x0), num(r.y1-r.y0))
	b.printf(`<text class="%s" x="%s" y="%s" text-anchor="%s">%s</text>`+"\n", class, num(x), num(y), anchor, esc(text))
	return r
}

// textWidth estimates the width of text at fontSize, in pixels.
func textWidth(text string) float64 {
	return float64(utf8.RuneCountInString(text)) * charWidth
}

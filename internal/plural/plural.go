// Package plural writes counts of things in English: "1 token", "2 tokens".
package plural

import (
	"strconv"
	"strings"
)

// Count returns n and noun, in the plural unless n is 1 or -1: Count(1,
// "token") is "1 token", Count(0, "token") is "0 tokens", Count(3, "pass")
// is "3 passes". It serves the regular nouns: the plural adds "es" after s,
// x, z, ch and sh, and "s" after anything else.
func Count[N ~int | ~int64](n N, noun string) string {
	s := strconv.FormatInt(int64(n), 10) + " " + noun
	switch {
	case n == 1 || n == -1:
		return s
	case strings.HasSuffix(noun, "s"), strings.HasSuffix(noun, "x"), strings.HasSuffix(noun, "z"),
		strings.HasSuffix(noun, "ch"), strings.HasSuffix(noun, "sh"):
		return s + "es"
	}
	return s + "s"
}

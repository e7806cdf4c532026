package policy

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"strconv"
)

// The document is walked by hand rather than decoded into structs, so that
// every problem can be located (its JSON path and its line), an unknown or
// repeated field is found wherever it is, and a wrong value in one field does
// not hide the problems of the others.

// value is a JSON value of the document and where it starts in it.
type value struct {
	raw json.RawMessage
	off int64
}

// member is one field of a JSON object.
type member struct {
	key    string
	keyOff int64
	val    value
}

const space = " \t\r\n"

// skip returns the offset of the first byte at or after off in b that is
// not in set.
func skip(b []byte, off int64, set string) int64 {
	for off < int64(len(b)) && bytes.IndexByte([]byte(set), b[off]) >= 0 {
		off++
	}
	return off
}

// kind describes a JSON value for messages: `a string "x"`, `the number
// 1.5`, `an object`.
func (v value) kind() string {
	if len(v.raw) == 0 {
		return "nothing"
	}
	switch v.raw[0] {
	case '"':
		s := string(v.raw)
		if len(s) > 40 {
			s = s[:37] + "...\""
		}
		return "a string " + s
	case '{':
		return "an object"
	case '[':
		return "an array"
	case 't', 'f':
		return "a boolean"
	case 'n':
		return "null"
	}
	return "the number " + string(v.raw)
}

// object returns the members of v, which must be an object, in order.
func (v value) object() ([]member, bool) {
	if len(v.raw) == 0 || v.raw[0] != '{' {
		return nil, false
	}
	dec := json.NewDecoder(bytes.NewReader(v.raw))
	if _, err := dec.Token(); err != nil {
		return nil, false
	}
	var ms []member
	for dec.More() {
		keyOff := skip(v.raw, dec.InputOffset(), space+",")
		tok, err := dec.Token()
		key, ok := tok.(string)
		if err != nil || !ok {
			return nil, false
		}
		valOff := skip(v.raw, dec.InputOffset(), space+":")
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			return nil, false
		}
		ms = append(ms, member{key: key, keyOff: v.off + keyOff, val: value{raw: raw, off: v.off + valOff}})
	}
	return ms, true
}

// array returns the elements of v, which must be an array, in order.
func (v value) array() ([]value, bool) {
	if len(v.raw) == 0 || v.raw[0] != '[' {
		return nil, false
	}
	dec := json.NewDecoder(bytes.NewReader(v.raw))
	if _, err := dec.Token(); err != nil {
		return nil, false
	}
	var vs []value
	for dec.More() {
		off := skip(v.raw, dec.InputOffset(), space+",")
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			return nil, false
		}
		vs = append(vs, value{raw: raw, off: v.off + off})
	}
	return vs, true
}

// str returns v as a string.
func (v value) str() (string, bool) {
	if len(v.raw) == 0 || v.raw[0] != '"' {
		return "", false
	}
	var s string
	if err := json.Unmarshal(v.raw, &s); err != nil {
		return "", false
	}
	return s, true
}

// number returns v as a float64.
func (v value) number() (float64, bool) {
	if len(v.raw) == 0 || !(v.raw[0] == '-' || v.raw[0] >= '0' && v.raw[0] <= '9') {
		return 0, false
	}
	f, err := strconv.ParseFloat(string(v.raw), 64)
	return f, err == nil
}

// integer returns v as an int64: an integer, in any JSON notation ("1e3"
// too), that int64 holds.
func (v value) integer() (int64, bool) {
	if n, err := strconv.ParseInt(string(v.raw), 10, 64); err == nil {
		return n, true
	}
	f, ok := v.number()
	if !ok || f != math.Trunc(f) || f < math.MinInt64 || f >= math.MaxInt64 {
		return 0, false
	}
	return int64(f), true
}

// parseDocument checks that doc is one JSON value and nothing else, and
// returns it, or an error and the offset it is at.
func parseDocument(doc []byte) (value, int64, error) {
	dec := json.NewDecoder(bytes.NewReader(doc))
	var raw json.RawMessage
	if err := dec.Decode(&raw); err != nil {
		var se *json.SyntaxError
		switch {
		case errors.As(err, &se):
			// Offset counts the bytes read, the bad one included.
			return value{}, max(se.Offset-1, 0), fmt.Errorf("invalid JSON: %v", se)
		case errors.Is(err, io.EOF):
			return value{}, int64(len(doc)), errors.New("invalid JSON: the document is empty")
		case errors.Is(err, io.ErrUnexpectedEOF):
			return value{}, int64(len(doc)), errors.New("invalid JSON: the document ends too early")
		}
		return value{}, int64(len(doc)), fmt.Errorf("invalid JSON: %v", err)
	}
	v := value{raw: raw, off: skip(doc, 0, space)}
	end := dec.InputOffset()
	if rest := skip(doc, end, space); rest < int64(len(doc)) {
		return value{}, rest, errors.New("invalid JSON: more data after the document")
	}
	return v, 0, nil
}

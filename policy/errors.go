package policy

import (
	"fmt"
	"strings"
)

// Error is one problem of a document, as Load and LoadFile report it. It
// names the plan, the rule and the field, and says where the value is.
// errors.Is(err, ErrInvalid) holds for every Error.
type Error struct {
	// File is the path LoadFile was given; "" for Load.
	File string
	// Line and Column locate the value (or the field's name, for an
	// unknown or repeated field), from 1, in bytes. They are 0 if the
	// problem is not at one place.
	Line, Column int
	// Path is the JSON path of the value, such as "plans[0].rules[2].burst";
	// "" for the document itself.
	Path string
	// Plan and Rule are the names of the plan and the rule the problem is
	// in, "" if none (or if they have no valid name).
	Plan, Rule string
	// Err is the problem.
	Err error

	where string // `plan "free" rule "reports"`, `shared rule #2`, ...
}

// Error returns the problem with where it is:
//
//	policy: rules.json:14:16: plan "free" rule "reports": burst: 0 is outside [1, 1000000000]
func (e *Error) Error() string {
	var b strings.Builder
	b.WriteString("policy: ")
	switch {
	case e.File != "" && e.Line > 0:
		fmt.Fprintf(&b, "%s:%d:%d: ", e.File, e.Line, e.Column)
	case e.File != "":
		fmt.Fprintf(&b, "%s: ", e.File)
	case e.Line > 0:
		fmt.Fprintf(&b, "line %d, column %d: ", e.Line, e.Column)
	}
	if e.where != "" {
		b.WriteString(e.where + ": ")
	}
	if f := field(e.Path); f != "" {
		b.WriteString(f + ": ")
	}
	b.WriteString(e.Err.Error())
	return b.String()
}

// Unwrap returns e.Err.
func (e *Error) Unwrap() error { return e.Err }

// Is reports whether target is ErrInvalid.
func (e *Error) Is(target error) bool { return target == ErrInvalid }

// field returns the last field name of a JSON path, "" if it ends with an
// index or is empty.
func field(path string) string {
	if strings.HasSuffix(path, "]") {
		return ""
	}
	return path[strings.LastIndexByte(path, '.')+1:]
}

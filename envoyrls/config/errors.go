package config

import (
	"errors"
	"strconv"
	"strings"
)

// Error is a configuration that Load, LoadDir or LoadFS rejects. It names the file,
// and the domain and the descriptor when they are known, and wraps the
// problem: one of the Err sentinels below, often with detail after it.
//
//	config: limits.yaml: domain "mongo_cps": descriptor "database_users": duplicate key
type Error struct {
	// File is the name of the file, as given to Load (File.Name) or, for
	// LoadDir and LoadFS, the file's path relative to the directory, with
	// slashes.
	File string
	// Domain is the file's domain, "" if the problem comes before the
	// domain is known (malformed YAML, a missing domain).
	Domain string
	// Path is the descriptor path of the descriptor the problem is in: the
	// composite keys ("key" or "key_value") from the top of the domain,
	// joined by dots, such as "key1_value1.subkey1". It is "" for a problem
	// of the file itself or of its top-level list. For an empty key it is
	// the path of the list that holds the descriptor.
	Path string
	// Err is the problem. errors.Is(e, ErrDuplicateKey) and the like hold
	// through it.
	Err error
}

// Error returns the problem prefixed with where it is, as in
// `config: f.yaml: domain "d": descriptor "k_v": duplicate key`.
func (e *Error) Error() string {
	var b strings.Builder
	b.WriteString("config: ")
	if e.File != "" {
		b.WriteString(e.File)
		b.WriteString(": ")
	}
	if e.Domain != "" {
		b.WriteString("domain ")
		b.WriteString(strconv.Quote(e.Domain))
		b.WriteString(": ")
	}
	if e.Path != "" {
		b.WriteString("descriptor ")
		b.WriteString(strconv.Quote(e.Path))
		b.WriteString(": ")
	}
	if e.Err != nil {
		b.WriteString(e.Err.Error())
	}
	return b.String()
}

// Unwrap returns e.Err.
func (e *Error) Unwrap() error { return e.Err }

// The problems an Error wraps. They are never returned alone, so their
// text, the end of an Error's message, carries no package prefix: the
// Error's message has it.
var (
	// ErrSyntax is a file that is not valid YAML, as the YAML library
	// reports it.
	ErrSyntax = errors.New("invalid YAML")
	// ErrType is a value that does not decode into its field, such as a
	// root that is not a map, requests_per_unit: -1 or descriptors: 5.
	ErrType = errors.New("value of the wrong type")
	// ErrFieldName is a field name that is not a string, such as 0.25 or
	// true.
	ErrFieldName = errors.New("field name is not a string")
	// ErrUnknownField is a field name that the format has nowhere.
	ErrUnknownField = errors.New("unknown field")
	// ErrNotMap is an element of a list that is not a map, as in
	// descriptors: [a, b].
	ErrNotMap = errors.New("list element is not a map")
	// ErrValue is a value of a kind the format has nowhere: a float, or an
	// integer beyond the range of int64.
	ErrValue = errors.New("unsupported value")
	// ErrEmptyDomain is a file without a domain.
	ErrEmptyDomain = errors.New("empty domain")
	// ErrDuplicateDomain is a domain that an earlier file already has,
	// unless Options.MergeDomains is set.
	ErrDuplicateDomain = errors.New("duplicate domain")
	// ErrEmptyKey is a descriptor without a key.
	ErrEmptyKey = errors.New("empty key")
	// ErrDuplicateKey is a descriptor whose composite key ("key" or
	// "key_value") another descriptor of the same list already has.
	ErrDuplicateKey = errors.New("duplicate key")
	// ErrUnit is a limited rate_limit whose unit is missing or is not one
	// of second, minute, hour, day, week, month and year.
	ErrUnit = errors.New("invalid unit")
	// ErrUnlimitedUnit is an unlimited rate_limit that names a valid unit.
	ErrUnlimitedUnit = errors.New("unit set on an unlimited rate_limit")
	// ErrReplacesEmpty is an entry of replaces without a name.
	ErrReplacesEmpty = errors.New("replaces entry without a name")
	// ErrReplacesSelf is a rate_limit that replaces its own name.
	ErrReplacesSelf = errors.New("rate_limit replaces its own name")
	// ErrMode is a mode field (this package's own, see Mode) that is not
	// lease, optimistic or exact, or one outside a rate_limit.
	ErrMode = errors.New("invalid mode")
	// ErrShareThreshold is share_threshold on a descriptor whose composite
	// key has no wildcard.
	ErrShareThreshold = errors.New("share_threshold without a wildcard")
	// ErrMetadata is metadata that cannot become a google.protobuf.Struct:
	// a string, or a map key, that is not valid UTF-8.
	ErrMetadata = errors.New("invalid metadata")
)

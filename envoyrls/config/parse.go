package config

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
	"strings"
	"unicode/utf8"

	"gopkg.in/yaml.v2"
)

// The shape of a file, for the YAML library. A field name that the
// library does not find here is ignored by it, which is why parse checks
// every name against knownFields first.
type (
	yamlRoot struct {
		Domain      string           `yaml:"domain"`
		Descriptors []yamlDescriptor `yaml:"descriptors"`
	}
	yamlDescriptor struct {
		Key            string           `yaml:"key"`
		Value          string           `yaml:"value"`
		RateLimit      *yamlRateLimit   `yaml:"rate_limit"`
		Descriptors    []yamlDescriptor `yaml:"descriptors"`
		ShadowMode     bool             `yaml:"shadow_mode"`
		QuotaMode      bool             `yaml:"quota_mode"`
		DetailedMetric bool             `yaml:"detailed_metric"`
		ValueToMetric  bool             `yaml:"value_to_metric"`
		ShareThreshold bool             `yaml:"share_threshold"`
		Metadata       map[string]any   `yaml:"metadata"`
	}
	yamlRateLimit struct {
		RequestsPerUnit uint32        `yaml:"requests_per_unit"`
		Unit            string        `yaml:"unit"`
		Unlimited       bool          `yaml:"unlimited"`
		Name            string        `yaml:"name"`
		Replaces        []yamlReplace `yaml:"replaces"`
		Mode            string        `yaml:"mode"` // this package's own field
	}
	yamlReplace struct {
		Name string `yaml:"name"`
	}
)

// knownFields are the field names the format has, at any level. Like the
// original, parse checks names against the whole set, not against the
// fields of the map they are in: a known name in the wrong place (unit in
// a descriptor, key at the top) passes, and the decoder then ignores it.
var knownFields = map[string]bool{
	"domain":            true,
	"key":               true,
	"value":             true,
	"descriptors":       true,
	"rate_limit":        true,
	"unit":              true,
	"requests_per_unit": true,
	"unlimited":         true,
	"shadow_mode":       true,
	"quota_mode":        true,
	"name":              true,
	"replaces":          true,
	"detailed_metric":   true,
	"value_to_metric":   true,
	"share_threshold":   true,
	"metadata":          true,
}

// modeField is the field this package adds to the format: a rate_limit's
// settlement mode (Mode). Unlike the original's fields it is known in one
// place only, a rate_limit map; anywhere else it is ErrMode, so that a
// misplaced mode is never silently ignored.
const modeField = "mode"

// parse decodes one file the way the original does: into a generic map
// first, whose field names and values it checks, then into yamlRoot.
// Errors are *Error.
func parse(file string, data []byte) (root *yamlRoot, err error) {
	defer func() {
		// The YAML library reports problems with panics that it recovers
		// itself; should one escape, it is still a file it cannot read.
		if p := recover(); p != nil {
			root, err = nil, &Error{File: file, Err: fmt.Errorf("%w: %v", ErrSyntax, p)}
		}
	}()
	var doc map[any]any
	if err := yaml.Unmarshal(data, &doc); err != nil {
		return nil, yamlError(file, "", err)
	}
	domain := text(doc["domain"])
	if err := checkMap(doc, place{file: file, domain: domain}); err != nil {
		return nil, err
	}
	root = new(yamlRoot)
	if err := yaml.Unmarshal(data, root); err != nil {
		return nil, yamlError(file, domain, err)
	}
	return root, nil
}

// yamlError wraps an error of the YAML library in an *Error: ErrType for
// values that do not fit their field, ErrSyntax for the rest.
func yamlError(file, domain string, err error) error {
	var te *yaml.TypeError
	if errors.As(err, &te) {
		return &Error{File: file, Domain: domain, Err: fmt.Errorf("%w: %s", ErrType, strings.Join(te.Errors, "; "))}
	}
	return &Error{File: file, Domain: domain, Err: fmt.Errorf("%w: %w", ErrSyntax, err)}
}

// place is where checkMap is in a file, for its errors.
type place struct {
	file, domain string
	path         string // descriptor path, "" at the top
	field        string // the field whose value is checked, for messages
}

// inRateLimit reports whether p is in the map of a rate_limit field.
func (p place) inRateLimit() bool {
	return p.field == "rate_limit" || strings.HasSuffix(p.field, ".rate_limit")
}

// fail returns an *Error at p.
func (p place) fail(err error) error {
	if p.field != "" {
		err = fmt.Errorf("%s: %w", p.field, err)
	}
	return &Error{File: p.file, Domain: p.domain, Path: p.path, Err: err}
}

// checkMap checks a map of the generic decoding: every field name is a
// string the format knows, and every value (but metadata's) is a string,
// an integer, a bool, null, a map that checkMap accepts or a list of them.
// The original checks the same, in the map's random order; this goes in
// the order of the names, so that a file with several problems always
// reports the same one.
func checkMap(m map[any]any, p place) error {
	names := make([]any, 0, len(m))
	for k := range m {
		names = append(names, k)
	}
	slices.SortFunc(names, func(a, b any) int {
		return cmp.Compare(fmt.Sprintf("%T %v", a, a), fmt.Sprintf("%T %v", b, b))
	})
	for _, k := range names {
		name, ok := k.(string)
		if !ok {
			return p.fail(fmt.Errorf("%w: %v", ErrFieldName, k))
		}
		if name == modeField {
			if !p.inRateLimit() {
				return p.fail(fmt.Errorf("%w: the field %q belongs in a rate_limit", ErrMode, name))
			}
			continue
		}
		if !knownFields[name] {
			return p.fail(fmt.Errorf("%w %q", ErrUnknownField, name))
		}
	}
	for _, k := range names {
		name := k.(string)
		if name == "metadata" {
			// Any shape; decoding and convertMetadata check it.
			continue
		}
		in := p
		in.field = name
		if p.field != "" {
			in.field = p.field + "." + name
		}
		if err := checkValue(m[k], name, in); err != nil {
			return err
		}
	}
	return nil
}

// checkValue checks the value of field name; see checkMap.
func checkValue(v any, name string, p place) error {
	switch v := v.(type) {
	case []any:
		for _, e := range v {
			m, ok := e.(map[any]any)
			if !ok {
				return p.fail(fmt.Errorf("%w: %v", ErrNotMap, e))
			}
			in := p
			if name == "descriptors" {
				in.path = joinPath(p.path, composite(text(m["key"]), text(m["value"])))
				in.field = ""
			}
			if err := checkMap(m, in); err != nil {
				return err
			}
		}
	case map[any]any:
		return checkMap(v, p)
	case string, int, bool, nil:
	default:
		return p.fail(fmt.Errorf("%w: %v", ErrValue, v))
	}
	return nil
}

// text is a scalar of the generic decoding as the decoder into a string
// field would give it, near enough for messages.
func text(v any) string {
	switch v := v.(type) {
	case nil:
		return ""
	case string:
		return v
	case int, bool:
		return fmt.Sprint(v)
	}
	return "?"
}

// composite is a descriptor's composite key: its key, followed by an
// underscore and its value if it has one. It keys the descriptor in its
// list and names it in stats keys.
func composite(key, value string) string {
	if value == "" {
		return key
	}
	return key + "_" + value
}

// joinPath appends a composite key to a descriptor path.
func joinPath(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

// convertMetadata turns decoded metadata into what it would be as a
// google.protobuf.Struct built with structpb.NewStruct, as the original
// builds one: nested maps get string keys (fmt's %v of the key), and a
// string or key that is not valid UTF-8 is an error. Empty metadata is
// nil.
func convertMetadata(m map[string]any) (map[string]any, error) {
	if len(m) == 0 {
		return nil, nil
	}
	out := make(map[string]any, len(m))
	for _, k := range sortedKeys(m) {
		if !utf8.ValidString(k) {
			return nil, fmt.Errorf("%w: invalid UTF-8 in key %q", ErrMetadata, k)
		}
		v, err := convertValue(m[k])
		if err != nil {
			return nil, err
		}
		out[k] = v
	}
	return out, nil
}

// convertValue converts one value of metadata; see convertMetadata.
func convertValue(v any) (any, error) {
	switch v := v.(type) {
	case map[any]any:
		keys := make([]any, 0, len(v))
		for k := range v {
			keys = append(keys, k)
		}
		// Keys such as 1 and "1" become the same string; in key order the
		// same one always wins.
		slices.SortFunc(keys, func(a, b any) int {
			return cmp.Compare(fmt.Sprintf("%T %v", a, a), fmt.Sprintf("%T %v", b, b))
		})
		out := make(map[string]any, len(v))
		for _, k := range keys {
			ks := fmt.Sprintf("%v", k)
			if !utf8.ValidString(ks) {
				return nil, fmt.Errorf("%w: invalid UTF-8 in key %q", ErrMetadata, ks)
			}
			e, err := convertValue(v[k])
			if err != nil {
				return nil, err
			}
			out[ks] = e
		}
		return out, nil
	case []any:
		out := make([]any, len(v))
		for i, e := range v {
			c, err := convertValue(e)
			if err != nil {
				return nil, err
			}
			out[i] = c
		}
		return out, nil
	case string:
		if !utf8.ValidString(v) {
			return nil, fmt.Errorf("%w: invalid UTF-8 in string %q", ErrMetadata, v)
		}
		return v, nil
	case nil, bool, int, int64, uint64, float64:
		return v, nil
	}
	return nil, fmt.Errorf("%w: value of type %T", ErrMetadata, v)
}

// sortedKeys returns the keys of m in order.
func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

package config_test

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"testing/fstest"

	"github.com/hybridlimit/hybrid/envoyrls/config"
)

// TestLoadAccepts loads documents the original accepts, quirks included,
// and checks one lookup in each.
func TestLoadAccepts(t *testing.T) {
	for _, tt := range []struct {
		name string
		doc  string
		l    lookup
	}{
		{"known field in the wrong place is ignored", `
domain: d
unit: second
descriptors:
  - key: k
    unit: hour
    domain: other
    rate_limit: {unit: minute, requests_per_unit: 2, key: ignored}
`, lookup{domain: "d", entries: es("k", "v"), want: minute(2, "d.k")}},
		{"replaces a name nothing has", `
domain: d
descriptors:
  - key: k
    rate_limit: {unit: minute, requests_per_unit: 2, replaces: [{name: nobody}]}
`, lookup{domain: "d", entries: es("k", "v"), want: minute(2, "d.k")}},
		{"scalars decode into strings as written", `
domain: 5
descriptors:
  - key: 10
    value: true
    rate_limit: {unit: minute, requests_per_unit: 2}
`, lookup{domain: "5", entries: es("10", "true"), want: minute(2, "5.10_true")}},
		{"null value and rate_limit", `
domain: d
descriptors:
  - key: k
    value: ~
    rate_limit: ~
  - key: j
    value: null
    rate_limit: {unit: minute, requests_per_unit: 2}
`, lookup{domain: "d", entries: es("j", "x"), want: minute(2, "d.j")}},
		{"YAML 1.1 booleans", `
domain: d
descriptors:
  - key: k
    shadow_mode: yes
    rate_limit: {unit: minute, requests_per_unit: 2, unlimited: off}
`, lookup{domain: "d", entries: es("k", "x"), want: &hit{rpu: 2, unit: config.UnitMinute, shadow: true, key: "d.k"}}},
		{"anchors and merge keys", `
domain: d
descriptors:
  - key: a
    rate_limit: &lim {unit: minute, requests_per_unit: 2}
  - key: b
    rate_limit:
      <<: *lim
      requests_per_unit: 3
`, lookup{domain: "d", entries: es("b", "x"), want: minute(3, "d.b")}},
		{"requests_per_unit 0 and the largest uint32", `
domain: d
descriptors:
  - key: none
    rate_limit: {unit: second, requests_per_unit: 0}
  - key: max
    rate_limit: {unit: second, requests_per_unit: 4294967295}
`, lookup{domain: "d", entries: es("max", "x"), want: &hit{rpu: 4294967295, unit: config.UnitSecond, key: "d.max"}}},
		{"only the first document counts", `
domain: d
descriptors:
  - key: k
    rate_limit: {unit: minute, requests_per_unit: 2}
---
nonsense: [1.5]
`, lookup{domain: "d", entries: es("k", "x"), want: minute(2, "d.k")}},
		{"repeated field: the last wins", `
domain: d
descriptors:
  - key: k
    rate_limit: {unit: minute, requests_per_unit: 2}
    rate_limit: {unit: hour, requests_per_unit: 3}
`, lookup{domain: "d", entries: es("k", "x"), want: &hit{rpu: 3, unit: config.UnitHour, key: "d.k"}}},
		{"a domain without descriptors", "domain: d\n", lookup{domain: "d", entries: es("k", "x")}},
		{"long keys and values", "domain: d\ndescriptors:\n  - key: " + strings.Repeat("k", 300) + "\n    value: " +
			strings.Repeat("v", 300) + "*\n    rate_limit: {unit: minute, requests_per_unit: 2}\n",
			lookup{domain: "d", entries: es(strings.Repeat("k", 300), strings.Repeat("v", 400)),
				want: minute(2, "d."+strings.Repeat("k", 300)+"_"+strings.Repeat("v", 300)+"*")}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			checkLookup(t, mustLoad(t, tt.doc), 0, tt.l)
		})
	}
}

// TestLoadRejects loads documents the original rejects, beyond those of its
// tests.
func TestLoadRejects(t *testing.T) {
	for _, tt := range []struct {
		name    string
		doc     string
		wantErr error
		wantMsg string // a fragment
	}{
		{"empty file", "", config.ErrEmptyDomain, "x.yaml: empty domain"},
		{"comments only", "# nothing\n", config.ErrEmptyDomain, "empty domain"},
		{"null document", "~\n", config.ErrEmptyDomain, "empty domain"},
		{"root is a list", "- domain: d\n", config.ErrType, "cannot unmarshal !!seq into map"},
		{"root is a scalar", "domain\n", config.ErrType, "cannot unmarshal !!str `domain` into map"},
		{"tab indentation", "domain: d\ndescriptors:\n\t- key: k\n", config.ErrSyntax, "invalid YAML: yaml: line 3"},
		{"list as a map key", "domain: d\n? [a]\n: b\n", config.ErrSyntax, "invalid map key"},
		{"unknown field at the top", "domain: d\nlimits: []\n", config.ErrUnknownField, `domain "d": unknown field "limits"`},
		{"float value", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1.5}\n",
			config.ErrValue, `descriptor "k": rate_limit.requests_per_unit: unsupported value: 1.5`},
		{"integer beyond int64", "domain: d\ndescriptors:\n  - key: k\n    value: 18446744073709551615\n",
			config.ErrValue, `value: unsupported value: 18446744073709551615`},
		{"negative requests_per_unit", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: -1}\n",
			config.ErrType, "line 4: cannot unmarshal !!int `-1` into uint32"},
		{"requests_per_unit beyond uint32", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 4294967296}\n",
			config.ErrType, "into uint32"},
		{"quoted bool", "domain: d\ndescriptors:\n  - key: k\n    shadow_mode: \"true\"\n", config.ErrType, "into bool"},
		{"descriptors not a list", "domain: d\ndescriptors: 5\n", config.ErrType, "cannot unmarshal !!int `5`"},
		{"key is a map", "domain: d\ndescriptors:\n  - key: {key: k}\n", config.ErrType, "cannot unmarshal !!map into string"},
		{"domain is a list of strings", "domain: [a]\n", config.ErrNotMap, "domain: list element is not a map: a"},
		{"non-string field name in a descriptor", "domain: d\ndescriptors:\n  - key: k\n    true: 1\n",
			config.ErrFieldName, `descriptor "k": field name is not a string: true`},
		{"replaces of strings", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1, replaces: [a]}\n",
			config.ErrNotMap, "rate_limit.replaces: list element is not a map: a"},
		{"empty rate_limit", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {}\n", config.ErrUnit, `invalid unit ""`},
		{"unknown unit", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: unknown, requests_per_unit: 1}\n",
			config.ErrUnit, `invalid unit "unknown"`},
		{"plural unit", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: seconds, requests_per_unit: 1}\n",
			config.ErrUnit, `invalid unit "seconds"`},
		{"replaces without a name, no name", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1, replaces: [{}]}\n",
			config.ErrReplacesEmpty, "replaces entry without a name"},
		{"share_threshold without a wildcard", "domain: d\ndescriptors:\n  - key: k\n    value: v\n    share_threshold: true\n",
			config.ErrShareThreshold, `descriptor "k_v": share_threshold without a wildcard`},
		{"duplicate composite key across underscores", "domain: d\ndescriptors:\n  - key: a\n    value: b_c\n  - key: a_b\n    value: c\n",
			config.ErrDuplicateKey, `descriptor "a_b_c": duplicate key`},
		{"duplicate key alone and key_value", "domain: d\ndescriptors:\n  - key: a\n    value: b\n  - key: a_b\n",
			config.ErrDuplicateKey, `descriptor "a_b": duplicate key`},
		{"empty key nested", "domain: d\ndescriptors:\n  - key: k\n    descriptors:\n      - key: j\n      - value: v\n",
			config.ErrEmptyKey, `descriptor "k": empty key (entry 2 of descriptors)`},
		{"metadata not a map", "domain: d\ndescriptors:\n  - key: k\n    metadata: [a]\n", config.ErrType, "into map[string]interface {}"},
		{"metadata with invalid UTF-8", "domain: d\ndescriptors:\n  - key: k\n    metadata: {a: !!binary /w==}\n",
			config.ErrMetadata, `invalid metadata: invalid UTF-8 in string "\xff"`},
		{"metadata with an invalid UTF-8 key", "domain: d\ndescriptors:\n  - key: k\n    metadata: {a: {!!binary /w==: 1}}\n",
			config.ErrMetadata, `invalid UTF-8 in key "\xff"`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, err := config.Load([]config.File{{Name: "x.yaml", Data: []byte(tt.doc)}}, config.Options{})
			if !errors.Is(err, tt.wantErr) {
				t.Fatalf("Load error = %v, want %v", err, tt.wantErr)
			}
			if !strings.Contains(err.Error(), tt.wantMsg) {
				t.Errorf("Load error = %q, want it to contain %q", err, tt.wantMsg)
			}
		})
	}
}

// TestErrorFields checks that an Error says where the problem is, and that
// the first problem of the first file is reported.
func TestErrorFields(t *testing.T) {
	ok := []byte("domain: ok\n")
	dup := []byte("domain: d\ndescriptors:\n  - key: a\n    descriptors:\n      - key: b\n        value: c\n      - key: b\n        value: c\n")
	bad := []byte("domain: e\ndescriptors:\n  - key: a\n    descriptors:\n      - key: b\n        rate_limt: {}\n")
	// bad.yaml is decoded before dup.yaml's tree is built, as the original
	// decodes every file first.
	_, err := config.Load([]config.File{{Name: "ok.yaml", Data: ok}, {Name: "dup.yaml", Data: dup}, {Name: "bad.yaml", Data: bad}}, config.Options{})
	var e *config.Error
	if !errors.As(err, &e) {
		t.Fatalf("Load error = %v, want a *config.Error", err)
	}
	if e.File != "bad.yaml" || e.Domain != "e" || e.Path != "a.b" || !errors.Is(e, config.ErrUnknownField) {
		t.Errorf("Error = %#v", e)
	}
	_, err = config.Load([]config.File{{Name: "ok.yaml", Data: ok}, {Name: "dup.yaml", Data: dup}}, config.Options{})
	if !errors.As(err, &e) {
		t.Fatalf("Load error = %v, want a *config.Error", err)
	}
	want := config.Error{File: "dup.yaml", Domain: "d", Path: "a.b_c", Err: config.ErrDuplicateKey}
	if *e != want {
		t.Errorf("Error = %#v, want %#v", *e, want)
	}
	if got, want := e.Error(), `config: dup.yaml: domain "d": descriptor "a.b_c": duplicate key`; got != want {
		t.Errorf("Error() = %q, want %q", got, want)
	}
	e = &config.Error{Domain: "a\"b", Err: config.ErrDuplicateDomain}
	if got, want := e.Error(), `config: domain "a\"b": duplicate domain`; got != want {
		t.Errorf("Error() = %q, want %q", got, want)
	}
}

func TestLoadDir(t *testing.T) {
	dir := t.TempDir()
	write := func(name, data string) {
		t.Helper()
		p := filepath.Join(dir, filepath.FromSlash(name))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("a.yaml", "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n")
	write("b.conf", "domain: b\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 2}\n")
	write("sub/c.yaml", "domain: c\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 3}\n")
	// A ConfigMap volume keeps the real files in a dot directory.
	write("..2024_01_01/a.yaml", "domain: a\n")
	if err := os.Symlink("..2024_01_01", filepath.Join(dir, "..data")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("sub/c.yaml", filepath.Join(dir, "link.yaml")); err != nil {
		t.Fatal(err)
	}

	// link.yaml is a second c.
	_, err := config.LoadDir(dir, config.Options{IgnoreDotFiles: true})
	var e *config.Error
	if !errors.As(err, &e) || e.File != "sub/c.yaml" || !errors.Is(err, config.ErrDuplicateDomain) ||
		!strings.Contains(err.Error(), "(also in link.yaml)") {
		t.Fatalf("LoadDir error = %v, want c twice", err)
	}
	_, err = config.LoadDir(dir, config.Options{IgnoreDotFiles: true, MergeDomains: true})
	if !errors.Is(err, config.ErrDuplicateKey) {
		t.Fatalf("LoadDir merging error = %v, want ErrDuplicateKey", err)
	}
	if err := os.Remove(filepath.Join(dir, "link.yaml")); err != nil {
		t.Fatal(err)
	}

	r, err := config.LoadDir(dir, config.Options{IgnoreDotFiles: true})
	if err != nil {
		t.Fatalf("LoadDir: %v", err)
	}
	if got, want := r.Domains(), []string{"a", "b", "c"}; !reflect.DeepEqual(got, want) {
		t.Errorf("Domains = %q, want %q", got, want)
	}
	if m, ok := r.Lookup("c", es("k", "v")); !ok || m.Limit.RequestsPerUnit != 3 {
		t.Errorf("Lookup(c) = %+v, %v", m, ok)
	}

	// Without IgnoreDotFiles, the dot directory is read (the link to it
	// is not), and comes first.
	_, err = config.LoadDir(dir, config.Options{})
	if !errors.As(err, &e) || e.File != "a.yaml" || !errors.Is(err, config.ErrDuplicateDomain) ||
		!strings.Contains(err.Error(), "(also in ..2024_01_01/a.yaml)") {
		t.Errorf("LoadDir error = %v, want a twice", err)
	}

	if err := os.Symlink("missing.yaml", filepath.Join(dir, "broken.yaml")); err != nil {
		t.Fatal(err)
	}
	if _, err := config.LoadDir(dir, config.Options{IgnoreDotFiles: true}); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("LoadDir with a broken link: error = %v, want ErrNotExist", err)
	}
	if _, err := config.LoadDir(filepath.Join(dir, "nowhere"), config.Options{}); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("LoadDir of a missing directory: error = %v, want ErrNotExist", err)
	}
}

func TestLoadFS(t *testing.T) {
	fsys := fstest.MapFS{
		"z.yaml":       {Data: []byte("domain: z\ndescriptors:\n  - key: k\n    rate_limit: {unit: year, requests_per_unit: 1}\n")},
		"a/b.yaml":     {Data: []byte("domain: a\n")},
		".git/config":  {Data: []byte("[core]\n")},
		"notes/.swp":   {Data: []byte("\x00")},
		"empty/.keep":  {Data: nil},
		"README":       {Data: []byte("domain: readme\n")},
		"nested/x/y/z": {Data: []byte("domain: deep\n")},
		"nested/x/y/w": {Mode: fs.ModeDir},
	}
	r, err := config.LoadFS(fsys, config.Options{IgnoreDotFiles: true})
	if err != nil {
		t.Fatalf("LoadFS: %v", err)
	}
	if got, want := r.Domains(), []string{"a", "deep", "readme", "z"}; !reflect.DeepEqual(got, want) {
		t.Errorf("Domains = %q, want %q", got, want)
	}
	// Without IgnoreDotFiles, .git/config is a file like the others.
	_, err = config.LoadFS(fsys, config.Options{})
	var e *config.Error
	if !errors.As(err, &e) || e.File != ".git/config" || !errors.Is(err, config.ErrType) {
		t.Errorf("LoadFS error = %v, want .git/config", err)
	}
	file := filepath.Join(t.TempDir(), "f.yaml")
	if err := os.WriteFile(file, []byte("domain: f\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := config.LoadDir(file, config.Options{}); err == nil {
		t.Error("LoadDir of a file: no error")
	}
}

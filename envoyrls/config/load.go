package config

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strings"
)

// Options says how Load, LoadDir and LoadFS read files. The zero Options
// reads them as the original does by default.
type Options struct {
	// MergeDomains lets several files configure one domain: their
	// descriptors are merged, and a composite key that two files give one
	// list is ErrDuplicateKey. It is the original's MERGE_DOMAIN_CONFIG.
	// false means a domain in a second file is ErrDuplicateDomain.
	MergeDomains bool
	// IgnoreDotFiles makes LoadDir and LoadFS skip the files and
	// directories whose names start with a dot, such as the "..data"
	// directories of a Kubernetes ConfigMap volume. It is the original's
	// RUNTIME_IGNOREDOTFILES. false means they are read like the others.
	// Load ignores it.
	IgnoreDotFiles bool
}

// File is one configuration file for Load.
type File struct {
	// Name names the file in errors.
	Name string
	// Data is the file's content: one YAML document.
	Data []byte
}

// Rules is a loaded configuration: the descriptor tree of every domain. It
// is immutable and safe for concurrent use. Create one with Load, LoadDir
// or LoadFS; the zero Rules has no domain.
type Rules struct {
	domains map[string]*domain
}

// domain is the tree of one domain.
type domain struct {
	name string
	file string // the file that configured it first
	root node   // has children and wildcards only
}

// node is one descriptor of the tree.
type node struct {
	key, value string
	composite  string // key, or key_value: its key in the parent's children
	fullKey    string // domain.path, the stats key of its limit
	pathAt     int    // where the path starts in fullKey

	limit *Limit // nil: no rate_limit

	shadowMode     bool
	quotaMode      bool
	detailedMetric bool
	valueToMetric  bool
	shareThreshold bool
	metadata       map[string]any

	children  map[string]*node // by composite key
	wildcards []wildcard       // the children whose composite key has a '*', in order
}

// path returns n's descriptor path, such as "key1_value1.subkey1".
func (n *node) path() string { return n.fullKey[n.pathAt:] }

// wildcard is a child whose composite key has a '*'.
type wildcard struct {
	parts [][]byte // the composite key split around each '*'
	node  *node
}

// Load reads the files in order, each one domain, and returns their rules.
// It rejects what the original rejects; the error is an *Error for the
// first problem: problems of YAML and field names of any file come first,
// as every file is decoded before any is loaded.
func Load(files []File, opts Options) (*Rules, error) {
	roots := make([]*yamlRoot, len(files))
	for i, f := range files {
		root, err := parse(f.Name, f.Data)
		if err != nil {
			return nil, err
		}
		roots[i] = root
	}
	r := &Rules{domains: make(map[string]*domain)}
	for i, f := range files {
		if err := r.add(f.Name, roots[i], opts.MergeDomains); err != nil {
			return nil, err
		}
	}
	return r, nil
}

// LoadDir loads every file under dir, in subdirectories too, whatever its
// name, as the original's runtime loader reads its directory. It is LoadFS
// of os.DirFS(dir), with errors of the file system naming dir.
func LoadDir(dir string, opts Options) (*Rules, error) {
	files, err := readFS(os.DirFS(dir), opts)
	if err != nil {
		return nil, fmt.Errorf("config: %s: %w", dir, err)
	}
	return Load(files, opts)
}

// LoadFS loads every file of fsys, in subdirectories too, whatever its
// name, as the original's runtime loader reads its directory. A file is
// named by its path in fsys; files are loaded in the lexical order of
// fs.WalkDir. Only regular files count, and symbolic links to them; a link
// to a directory is not followed. A file that cannot be read is an error
// (fs's, wrapped), where the original logs it and goes on without it.
func LoadFS(fsys fs.FS, opts Options) (*Rules, error) {
	files, err := readFS(fsys, opts)
	if err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	return Load(files, opts)
}

// readFS reads the files LoadFS loads.
func readFS(fsys fs.FS, opts Options) ([]File, error) {
	var files []File
	err := fs.WalkDir(fsys, ".", func(name string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if name == "." {
			if !d.IsDir() {
				return &fs.PathError{Op: "read", Path: name, Err: errNotDir}
			}
			return nil
		}
		if opts.IgnoreDotFiles && strings.HasPrefix(d.Name(), ".") {
			if d.IsDir() {
				return fs.SkipDir
			}
			return nil
		}
		switch t := d.Type(); {
		case t.IsDir():
			return nil
		case t&fs.ModeSymlink != 0:
			fi, err := fs.Stat(fsys, name)
			if err != nil {
				return err
			}
			if !fi.Mode().IsRegular() {
				return nil
			}
		case !t.IsRegular():
			return nil
		}
		data, err := fs.ReadFile(fsys, name)
		if err != nil {
			return err
		}
		files = append(files, File{Name: name, Data: data})
		return nil
	})
	return files, err
}

// errNotDir is the error of LoadFS when fsys's root is not a directory.
var errNotDir = errors.New("not a directory")

// add loads the domain of one decoded file.
func (r *Rules) add(file string, root *yamlRoot, merge bool) error {
	if root.Domain == "" {
		return &Error{File: file, Err: ErrEmptyDomain}
	}
	d := r.domains[root.Domain]
	if d != nil && !merge {
		return &Error{File: file, Domain: root.Domain, Err: fmt.Errorf("%w (also in %s)", ErrDuplicateDomain, d.file)}
	}
	if d == nil {
		d = &domain{name: root.Domain, file: file}
		d.root.fullKey = root.Domain
		d.root.pathAt = len(root.Domain)
		r.domains[root.Domain] = d
	}
	b := builder{file: file, domain: root.Domain}
	return b.descriptors(&d.root, root.Descriptors)
}

// builder adds the descriptors of one file to a domain's tree.
type builder struct {
	file, domain string
}

// fail returns an *Error for the descriptor at path.
func (b *builder) fail(path string, err error) error {
	return &Error{File: b.file, Domain: b.domain, Path: path, Err: err}
}

// descriptors adds list to parent's children, checking each descriptor as
// the original does and in its order: key, duplicate, rate_limit (unit,
// then replaces), share_threshold, metadata, then its own descriptors.
func (b *builder) descriptors(parent *node, list []yamlDescriptor) error {
	for i, yd := range list {
		if yd.Key == "" {
			return b.fail(parent.path(), fmt.Errorf("%w (entry %d of descriptors)", ErrEmptyKey, i+1))
		}
		n := &node{key: yd.Key, value: yd.Value, composite: composite(yd.Key, yd.Value)}
		n.fullKey = parent.fullKey + "." + n.composite
		n.pathAt = len(b.domain) + 1
		path := n.path()
		if _, dup := parent.children[n.composite]; dup {
			return b.fail(path, ErrDuplicateKey)
		}
		if rl := yd.RateLimit; rl != nil {
			lim, err := limitOf(rl)
			if err != nil {
				return b.fail(path, err)
			}
			n.limit = lim
		}
		wild := strings.Contains(n.composite, "*")
		if yd.ShareThreshold && !wild {
			return b.fail(path, ErrShareThreshold)
		}
		md, err := convertMetadata(yd.Metadata)
		if err != nil {
			return b.fail(path, err)
		}
		n.shadowMode = yd.ShadowMode
		n.quotaMode = yd.QuotaMode
		n.detailedMetric = yd.DetailedMetric
		n.valueToMetric = yd.ValueToMetric
		n.shareThreshold = yd.ShareThreshold
		n.metadata = md
		if err := b.descriptors(n, yd.Descriptors); err != nil {
			return err
		}
		if parent.children == nil {
			parent.children = make(map[string]*node)
		}
		parent.children[n.composite] = n
		if wild {
			parent.wildcards = append(parent.wildcards, wildcard{
				parts: bytes.Split([]byte(n.composite), []byte("*")),
				node:  n,
			})
		}
	}
	return nil
}

// limitOf checks a rate_limit block and returns its Limit.
func limitOf(rl *yamlRateLimit) (*Limit, error) {
	unit, valid := parseUnit(rl.Unit)
	if rl.Unlimited && valid {
		return nil, fmt.Errorf("%w (%q)", ErrUnlimitedUnit, rl.Unit)
	}
	if !rl.Unlimited && !valid {
		return nil, fmt.Errorf("%w %q", ErrUnit, rl.Unit)
	}
	mode := ModeDefault
	if rl.Mode != "" {
		m, ok := parseMode(rl.Mode)
		if !ok {
			return nil, fmt.Errorf("%w %q (want lease, optimistic or exact)", ErrMode, rl.Mode)
		}
		mode = m
	}
	var replaces []string
	if len(rl.Replaces) > 0 {
		replaces = make([]string, len(rl.Replaces))
	}
	for i, r := range rl.Replaces {
		if r.Name == "" {
			return nil, fmt.Errorf("%w (entry %d)", ErrReplacesEmpty, i+1)
		}
		if r.Name == rl.Name {
			return nil, fmt.Errorf("%w %q", ErrReplacesSelf, r.Name)
		}
		replaces[i] = r.Name
	}
	return &Limit{
		RequestsPerUnit: rl.RequestsPerUnit,
		Unit:            unit,
		Unlimited:       rl.Unlimited,
		Name:            rl.Name,
		Replaces:        replaces,
		Mode:            mode,
	}, nil
}

// HasDomain reports whether some file configures domain. A Lookup in a
// domain that no file configures finds nothing, as one that matches no
// descriptor; the original counts the first kind in the stat
// "<domain>.domain_not_found".
func (r *Rules) HasDomain(domain string) bool {
	_, ok := r.domains[domain]
	return ok
}

// Domains returns the configured domains, in order.
func (r *Rules) Domains() []string {
	return sortedKeys(r.domains)
}

// Dump returns every limit of the rules, one a line, in order, as the
// original's /rlconfig page prints them:
//
//	mongo_cps.database_users: unit=SECOND requests_per_unit=500, shadow_mode: false, quota_mode: false
//
// A limit whose file names a mode (Mode) has ", mode: lease" (or the mode
// it names) at the end of its line.
func (r *Rules) Dump() string {
	var b strings.Builder
	for _, name := range sortedKeys(r.domains) {
		dump(&b, &r.domains[name].root)
	}
	return b.String()
}

// dump writes the limits of n and its descendants.
func dump(b *strings.Builder, n *node) {
	if l := n.limit; l != nil {
		fmt.Fprintf(b, "%s: unit=%s requests_per_unit=%d, shadow_mode: %t, quota_mode: %t",
			n.fullKey, strings.ToUpper(l.Unit.String()), l.RequestsPerUnit, n.shadowMode, n.quotaMode)
		if l.Mode != ModeDefault {
			fmt.Fprintf(b, ", mode: %v", l.Mode)
		}
		b.WriteByte('\n')
	}
	for _, k := range sortedKeys(n.children) {
		dump(b, n.children[k])
	}
}

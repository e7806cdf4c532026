package runner

import (
	"context"
	"crypto/sha256"
	"fmt"
	"hash"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/hybridlimit/hybrid/envoyrls/config"
	"github.com/hybridlimit/hybrid/envoyrls/rls"
)

// watcher keeps the configuration of a directory in force: it checks a
// fingerprint of the directory every interval, and when the fingerprint
// has changed and then held still for one interval (so that a file being
// written is not read half-way), it loads the directory. Rules that load
// are stored in rules, atomically, for the requests that follow; rules
// that do not are logged, with the file, domain and descriptor path that
// config.Error names, and counted, and the rules in force stay. The same
// refused files are not loaded again until they change.
//
// The fingerprint covers what the original's runtime loader watches
// (goruntime: a symlink swap of RUNTIME_ROOT, or a file written, created,
// removed or chmod'ed in the directory) and more: where the directory's
// path leads through symbolic links, and every entry under it, with its
// type, mode, size, modification time, symbolic link target and, for files
// up to a MiB, a hash of its content.
type watcher struct {
	dir      string
	opts     config.Options
	interval time.Duration
	rules    *rls.Rules
	loads    *loads
	health   *healthState
	log      *slog.Logger
	onLoad   func(*config.Rules, error)

	// Only the watching goroutine reads and writes these.
	seen     [sha256.Size]byte // the fingerprint of the files last loaded or refused
	next     [sha256.Size]byte // a changed fingerprint waiting to hold still
	changing bool              // next is set
}

// start loads the directory for the first time.
func (w *watcher) start() {
	w.seen = fingerprint(w.dir)
	w.load()
}

// run checks the directory every interval until ctx ends.
func (w *watcher) run(ctx context.Context) {
	t := time.NewTicker(w.interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			w.check()
		}
	}
}

// check looks at the directory once, and loads it if it changed and has
// held still since the last check.
func (w *watcher) check() {
	fp := fingerprint(w.dir)
	switch {
	case fp == w.seen:
		w.changing = false
	case !w.changing || fp != w.next:
		w.next, w.changing = fp, true
	default:
		w.seen, w.changing = fp, false
		w.load()
	}
}

// load loads the directory and puts its rules in force if they are valid.
func (w *watcher) load() {
	r, err := config.LoadDir(w.dir, w.opts)
	if err != nil {
		w.loads.failure.Add(1)
		w.log.Error("configuration refused; the one in force is kept", "dir", w.dir, "err", err)
		if w.onLoad != nil {
			w.onLoad(w.rules.Load(), err)
		}
		return
	}
	w.rules.Store(r)
	domains := r.Domains()
	w.loads.success.Add(1)
	w.loads.domains.Store(int64(len(domains)))
	w.health.configLoaded(len(domains))
	w.log.Info("configuration loaded", "dir", w.dir, "domains", domains)
	if w.onLoad != nil {
		w.onLoad(r, nil)
	}
}

// maxHashed is the largest file whose content the fingerprint hashes;
// larger ones count by size and modification time.
const maxHashed = 1 << 20

// fingerprint returns a hash of the state of the directory tree at dir.
// An error (a directory that does not exist, a file that cannot be read)
// is part of the state.
func fingerprint(dir string) [sha256.Size]byte {
	h := sha256.New()
	resolved, err := filepath.EvalSymlinks(dir)
	fmt.Fprintf(h, "root %q %v\n", resolved, err)
	if err == nil {
		filepath.WalkDir(resolved, func(path string, d fs.DirEntry, err error) error {
			rel, _ := filepath.Rel(resolved, path)
			if err != nil {
				fmt.Fprintf(h, "error %q %v\n", rel, err)
				return nil
			}
			fmt.Fprintf(h, "entry %q %v\n", rel, d.Type())
			switch {
			case d.Type()&fs.ModeSymlink != 0:
				target, err := os.Readlink(path)
				fmt.Fprintf(h, "link %q %v\n", target, err)
				fi, err := os.Stat(path)
				fileState(h, path, fi, err)
			case d.Type().IsRegular():
				fi, err := d.Info()
				fileState(h, path, fi, err)
			}
			return nil
		})
	}
	var sum [sha256.Size]byte
	h.Sum(sum[:0])
	return sum
}

// fileState writes to h the state of the file at path, whose FileInfo is
// fi (or err).
func fileState(h hash.Hash, path string, fi fs.FileInfo, err error) {
	if err != nil {
		fmt.Fprintf(h, "stat %v\n", err)
		return
	}
	fmt.Fprintf(h, "stat %v %d %d\n", fi.Mode(), fi.Size(), fi.ModTime().UnixNano())
	if !fi.Mode().IsRegular() || fi.Size() > maxHashed {
		return
	}
	f, err := os.Open(path)
	if err != nil {
		fmt.Fprintf(h, "open %v\n", err)
		return
	}
	defer f.Close()
	n, err := io.Copy(h, io.LimitReader(f, maxHashed))
	fmt.Fprintf(h, "\ncontent %d %v\n", n, err)
}

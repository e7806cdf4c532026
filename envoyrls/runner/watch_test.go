package runner

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"google.golang.org/grpc/health"

	"github.com/hybridlimit/hybrid/envoyrls/config"
	"github.com/hybridlimit/hybrid/envoyrls/rls"
)

// The watch tests run in a synctest bubble: the ticker runs on the
// bubble's clock, and synctest.Wait lets the watcher finish what a tick
// started. The files are real.

// doc returns a configuration of domain d with a limit of n a minute for
// key k.
func doc(n string) string {
	return "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: " + n + "}\n"
}

// testWatcher is a watcher of dir under test, and what it did.
type testWatcher struct {
	*watcher
	mu     sync.Mutex // protects events
	events []error    // the errors of the loads after the first, nil for a success
}

// newTestWatcher returns a watcher of dir, reading it with opts and
// checking every second, started (its first load done); its run goroutine
// stops when the bubble's test ends.
func newTestWatcher(t *testing.T, dir string, opts config.Options) *testWatcher {
	w := &testWatcher{}
	w.watcher = &watcher{
		dir: dir, opts: opts, interval: time.Second, rules: new(rls.Rules), loads: new(loads),
		health: newHealth(health.NewServer(), false),
		log:    slog.New(slog.NewTextHandler(t.Output(), nil)),
	}
	w.start()
	w.onLoad = func(_ *config.Rules, err error) {
		w.mu.Lock()
		defer w.mu.Unlock()
		w.events = append(w.events, err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { w.run(ctx) })
	t.Cleanup(func() {
		cancel()
		wg.Wait()
	})
	return w
}

// tick lets n intervals pass and the watcher act on them.
func (w *testWatcher) tick(n int) {
	time.Sleep(time.Duration(n) * w.interval)
	synctest.Wait()
}

// state returns the loads so far, and the limit of k in force ("" for
// none).
func (w *testWatcher) state() ([]error, string) {
	w.mu.Lock()
	events := append([]error(nil), w.events...)
	w.mu.Unlock()
	r := w.rules.Load()
	if r == nil {
		return events, ""
	}
	dump := r.Dump()
	_, after, _ := strings.Cut(dump, "requests_per_unit=")
	n, _, _ := strings.Cut(after, ",")
	return events, n
}

// check fails t unless the loads since the first were refused or not as
// failures says (true for a refusal), in order, and the limit want is in
// force.
func (w *testWatcher) check(t *testing.T, step string, failures []bool, want string) {
	t.Helper()
	events, limit := w.state()
	var got []bool
	for _, e := range events {
		got = append(got, e != nil)
	}
	if len(got) != len(failures) || !equal(got, failures) || limit != want {
		t.Errorf("%s: loads (true: refused) %v, limit %q; want %v, %q", step, got, limit, failures, want)
	}
}

func equal(a, b []bool) bool {
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func write(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestWatchReload: a changed file is loaded once it has held still for an
// interval; a refused one keeps the rules in force and is not loaded again
// until it changes; a fixed one is loaded.
func TestWatchReload(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		dir := t.TempDir()
		f := filepath.Join(dir, "limits.yaml")
		write(t, f, doc("1"))
		w := newTestWatcher(t, dir, config.Options{})
		w.check(t, "start", nil, "1")

		w.tick(3)
		w.check(t, "unchanged", nil, "1")

		write(t, f, doc("2"))
		w.tick(1)
		w.check(t, "one interval after a change", nil, "1")
		w.tick(1)
		w.check(t, "two intervals after a change", []bool{false}, "2")

		write(t, f, "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: fortnight, requests_per_unit: 3}\n")
		w.tick(2)
		w.check(t, "a refused file", []bool{false, true}, "2")
		w.tick(5)
		w.check(t, "the refused file unchanged", []bool{false, true}, "2")
		if n := w.loads.failure.Load(); n != 1 {
			t.Errorf("failures counted %d, want 1", n)
		}
		events, _ := w.state()
		var cerr *config.Error
		if !errors.As(events[1], &cerr) || !errors.Is(cerr, config.ErrUnit) || cerr.File != "limits.yaml" || cerr.Domain != "d" || cerr.Path != "k" {
			t.Errorf("refusal %v: want a config.Error of ErrUnit naming limits.yaml, domain d, path k", events[1])
		}

		write(t, f, doc("4"))
		w.tick(2)
		w.check(t, "fixed", []bool{false, true, false}, "4")
		if n := w.loads.success.Load(); n != 3 {
			t.Errorf("successes counted %d, want 3 (the first load, two reloads)", n)
		}
	})
}

// TestWatchSettles: a file that changes at every check (being written) is
// not loaded until it holds still.
func TestWatchSettles(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		dir := t.TempDir()
		f := filepath.Join(dir, "limits.yaml")
		write(t, f, doc("1"))
		w := newTestWatcher(t, dir, config.Options{})
		for _, n := range []string{"2", "3", "4", "5"} {
			write(t, f, doc(n))
			w.tick(1)
		}
		w.check(t, "while it changes", nil, "1")
		w.tick(1)
		w.check(t, "once still", []bool{false}, "5")
	})
}

// TestWatchSymlinkSwap: the original's way to change its configuration,
// the runtime root a symbolic link swapped to another directory, reloads,
// even to a directory whose files are the same in every way (name, size,
// content, modification time).
func TestWatchSymlinkSwap(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		base := t.TempDir()
		file := func(v string) string { return filepath.Join(base, v, "ratelimit", "config", "limits.yaml") }
		for v, n := range map[string]string{"v1": "1", "v2": "7", "v3": "7"} {
			if err := os.MkdirAll(filepath.Dir(file(v)), 0o755); err != nil {
				t.Fatal(err)
			}
			write(t, file(v), doc(n))
		}
		fi, err := os.Stat(file("v2"))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.Chtimes(file("v3"), fi.ModTime(), fi.ModTime()); err != nil {
			t.Fatal(err)
		}
		current := filepath.Join(base, "current")
		if err := os.Symlink("v1", current); err != nil {
			t.Fatal(err)
		}
		w := newTestWatcher(t, filepath.Join(current, "ratelimit", "config"), config.Options{})
		w.check(t, "start", nil, "1")

		// A swap: a new link renamed over the old one, atomically.
		swap := func(to string) {
			if err := os.Symlink(to, filepath.Join(base, "next")); err != nil {
				t.Fatal(err)
			}
			if err := os.Rename(filepath.Join(base, "next"), current); err != nil {
				t.Fatal(err)
			}
		}
		swap("v2")
		w.tick(2)
		w.check(t, "after the swap to v2", []bool{false}, "7")
		swap("v3")
		w.tick(2)
		w.check(t, "after the swap to a copy of v2", []bool{false, false}, "7")
	})
}

// TestWatchKubernetes: a Kubernetes ConfigMap volume (files that are
// links into ..data, itself a link swapped to a new timestamped directory)
// with RUNTIME_IGNOREDOTFILES reloads when the ConfigMap changes.
func TestWatchKubernetes(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		dir := t.TempDir()
		for _, v := range []string{"..2026_01", "..2026_02"} {
			if err := os.Mkdir(filepath.Join(dir, v), 0o755); err != nil {
				t.Fatal(err)
			}
		}
		write(t, filepath.Join(dir, "..2026_01", "limits.yaml"), doc("1"))
		write(t, filepath.Join(dir, "..2026_02", "limits.yaml"), doc("9"))
		for target, link := range map[string]string{"..2026_01": "..data", "..data/limits.yaml": "limits.yaml"} {
			if err := os.Symlink(target, filepath.Join(dir, link)); err != nil {
				t.Fatal(err)
			}
		}
		w := newTestWatcher(t, dir, config.Options{IgnoreDotFiles: true})
		w.check(t, "start", nil, "1")

		if err := os.Symlink("..2026_02", filepath.Join(dir, "..data_tmp")); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(filepath.Join(dir, "..data_tmp"), filepath.Join(dir, "..data")); err != nil {
			t.Fatal(err)
		}
		w.tick(2)
		w.check(t, "after the ConfigMap's swap", []bool{false}, "9")
	})
}

// TestWatchMissingDir: a directory that goes away is refused (the rules
// stay) and loaded again when it is back.
func TestWatchMissingDir(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		base := t.TempDir()
		dir := filepath.Join(base, "config")
		if err := os.Mkdir(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		write(t, filepath.Join(dir, "limits.yaml"), doc("1"))
		w := newTestWatcher(t, dir, config.Options{})
		if err := os.Rename(dir, filepath.Join(base, "away")); err != nil {
			t.Fatal(err)
		}
		w.tick(2)
		w.check(t, "gone", []bool{true}, "1")
		if err := os.Rename(filepath.Join(base, "away"), dir); err != nil {
			t.Fatal(err)
		}
		write(t, filepath.Join(dir, "limits.yaml"), doc("3"))
		w.tick(2)
		w.check(t, "back", []bool{true, false}, "3")
	})
}

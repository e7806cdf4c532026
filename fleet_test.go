package hybrid_test

import (
	"context"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/hybridlimit/hybrid"
)

// link is a go-redis hook between one instance and a shared miniredis: it
// sets Redis TIME to the caller's clock before every command (inside a
// synctest bubble, the bubble's fake clock), plus skew, counts commands, and
// can cut the link, failing every command as a refused connection would.
type link struct {
	m        *miniredis.Miniredis
	down     atomic.Bool
	commands atomic.Int64
	skew     atomic.Int64 // ns added to the caller's clock to make Redis TIME
	delay    atomic.Int64 // ns every command waits before it is sent: a slow Redis
}

// wait waits for the link's delay, or until ctx ends.
func (l *link) wait(ctx context.Context) error {
	d := time.Duration(l.delay.Load())
	if d <= 0 {
		return nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// errLinkDown is what a cut link returns: a refused connection, as go-redis
// reports it when it cannot dial (the command was never sent).
var errLinkDown = &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}

func (l *link) DialHook(next redis.DialHook) redis.DialHook { return next }

func (l *link) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if l.down.Load() {
			cmd.SetErr(errLinkDown)
			return errLinkDown
		}
		if err := l.wait(ctx); err != nil {
			cmd.SetErr(err)
			return err
		}
		l.commands.Add(1)
		l.m.SetTime(time.Now().Add(time.Duration(l.skew.Load())))
		return next(ctx, cmd)
	}
}

func (l *link) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if l.down.Load() {
			for _, c := range cmds {
				c.SetErr(errLinkDown)
			}
			return errLinkDown
		}
		if err := l.wait(ctx); err != nil {
			for _, c := range cmds {
				c.SetErr(err)
			}
			return err
		}
		l.commands.Add(int64(len(cmds)))
		l.m.SetTime(time.Now().Add(time.Duration(l.skew.Load())))
		return next(ctx, cmds)
	}
}

// fleet is n Limiters sharing one miniredis, each with its own client and
// link. Make one inside a synctest bubble; miniredis itself must be started
// outside it (its server goroutines wait on the network, which a bubble does
// not count as durably blocked).
type fleet struct {
	m     *miniredis.Miniredis
	lims  []*hybrid.Limiter
	links []*link
}

func newFleet(t *testing.T, m *miniredis.Miniredis, n int, cfg hybrid.Config) *fleet {
	t.Helper()
	f := &fleet{m: m}
	for i := range n {
		f.add(t, cfg, string(rune('a'+i)))
	}
	return f
}

// add starts one more instance of f, named id, with its own client and link
// (with the skew of the fleet's first link, if any), closed at cleanup.
func (f *fleet) add(t *testing.T, cfg hybrid.Config, id string) {
	t.Helper()
	ln := &link{m: f.m}
	if len(f.links) > 0 {
		ln.skew.Store(f.links[0].skew.Load())
	}
	rdb := redis.NewClient(&redis.Options{Addr: f.m.Addr(), MaxRetries: -1})
	rdb.AddHook(ln)
	cfg.InstanceID = id
	l, err := hybrid.New(rdb, cfg)
	if err != nil {
		t.Fatal(err)
	}
	f.lims = append(f.lims, l)
	f.links = append(f.links, ln)
	t.Cleanup(func() {
		l.Close(context.Background())
		rdb.Close()
	})
}

// setSkew makes Redis TIME run skew ahead of the callers' clock (behind if
// negative), from the next command on.
func (f *fleet) setSkew(skew time.Duration) {
	for _, ln := range f.links {
		ln.skew.Store(int64(skew))
	}
}

// close closes every limiter, failing the test on an error.
func (f *fleet) close(t *testing.T) {
	t.Helper()
	for i, l := range f.lims {
		if err := l.Close(context.Background()); err != nil {
			t.Errorf("instance %d: Close: %v", i, err)
		}
	}
}

// setDown cuts or restores every instance's link.
func (f *fleet) setDown(down bool) {
	for _, ln := range f.links {
		ln.down.Store(down)
	}
}

// commands returns the Redis commands sent by the whole fleet.
func (f *fleet) commands() int64 {
	var n int64
	for _, ln := range f.links {
		n += ln.commands.Load()
	}
	return n
}

// tally counts decisions.
type tally struct {
	allowed, denied, errors atomic.Int64
	bySource                [3]atomic.Int64
	mu                      sync.Mutex
	firstErr                error
	asked, admitted         map[string]int64 // per key, when keys vary
}

func (c *tally) addKey(key string, res hybrid.Result, err error) {
	c.mu.Lock()
	if c.asked == nil {
		c.asked, c.admitted = map[string]int64{}, map[string]int64{}
	}
	c.asked[key]++
	if err == nil && res.Allowed {
		c.admitted[key]++
	}
	c.mu.Unlock()
	c.add(res, err)
}

func (c *tally) add(res hybrid.Result, err error) {
	switch {
	case err != nil:
		c.errors.Add(1)
		c.mu.Lock()
		if c.firstErr == nil {
			c.firstErr = err
		}
		c.mu.Unlock()
	case res.Allowed:
		c.allowed.Add(1)
		c.bySource[res.Source].Add(1)
	default:
		c.denied.Add(1)
	}
}

func (c *tally) check(t *testing.T) {
	t.Helper()
	if n := c.errors.Load(); n > 0 {
		t.Fatalf("%d decisions failed; the first: %v", n, c.firstErr)
	}
}

// drive makes every instance of f ask for key under lim every gap, from now
// until now+d, with instance i starting i*gap/len(f.lims) late, and counts
// the decisions in c. keyOf, if not nil, picks the key for each request.
func drive(f *fleet, key string, lim hybrid.Limit, gap, d time.Duration, c *tally, keyOf func(inst, i int) string) {
	var wg sync.WaitGroup
	end := time.Now().Add(d)
	for i, l := range f.lims {
		wg.Go(func() {
			time.Sleep(gap * time.Duration(i) / time.Duration(len(f.lims)))
			for n := 0; time.Now().Before(end); n++ {
				if keyOf == nil {
					c.add(l.Allow(context.Background(), key, lim))
				} else {
					k := keyOf(i, n)
					res, err := l.Allow(context.Background(), k, lim)
					c.addKey(k, res, err)
				}
				time.Sleep(gap)
			}
		})
	}
	wg.Wait()
}

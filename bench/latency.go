package bench

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"os"
	"os/exec"
	"slices"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/hybridlimit/hybrid/internal/redistest"
)

// A network between the fleet and Redis. Target.AddLatency puts a TCP proxy
// (redistest.Proxy) in front of every Redis node the Target uses, holding
// what it forwards for half the round trip in each direction, and the
// fleet's clients (every instance's, the redis_rate baselines', those of
// RunProcs's shards) dial through it. The bench's own reads of Redis (the
// clock, INFO, the long tail's cleaning) go direct.
//
// The proxy runs in a process of its own, this executable started again
// with ShardEnv set to shardProxy: in the fleet's process its goroutines
// would wait behind the workers for the Go scheduler, which notices the
// sockets that became ready only when a core runs out of work (or every
// 10ms), three times a round trip; in a process of its own they are
// scheduled by the kernel, as a network is no part of the client.

// shardProxy is the value of ShardEnv that makes a process the proxy of a
// Target with latency.
const shardProxy = "proxy"

// proxyJob is what the proxy process is asked, on the first line of its
// stdin.
type proxyJob struct {
	Targets []string      `json:"targets"`
	Latency time.Duration `json:"latency_ns"` // the round trip, half each way
}

// proxyReply is the proxy process's answer, on the first line of its
// stdout: the proxies' addresses, in the order of proxyJob.Targets, or an
// error.
type proxyReply struct {
	Addrs []string `json:"addrs,omitempty"`
	Error string   `json:"error,omitempty"`
}

// proxyWait bounds the wait for the proxy process to start.
const proxyWait = 10 * time.Second

// pingSamples is how many PINGs measure the round trip with and without
// the proxy.
const pingSamples = 21

// AddLatency makes the clients of t's runs reach Redis through a proxy that
// adds rtt to every round trip, half in each direction; 0 adds none. Call it
// once, before the first run. The proxy dials its target for each
// connection, so a Redis restarted on the same address (an Outage) is
// reached again. On a Redis Cluster every node CLUSTER SLOTS names has a
// proxy, and the clients' dialer maps the nodes' addresses, MOVED and ASK
// redirections included, to their proxies; a node added later cannot be
// dialled.
//
// AddLatency then times PING with and without the proxy (Target.String
// gives both): the proxy's own cost and a timer's wake-up come on top of
// rtt.
func (t *Target) AddLatency(ctx context.Context, rtt time.Duration) error {
	switch {
	case rtt < 0:
		return fmt.Errorf("%w: negative latency %v", ErrScenario, rtt)
	case rtt == 0:
		return nil
	case t.via != nil:
		return errors.New("bench: the Target has latency already")
	}
	nodes, err := t.nodes(ctx)
	if err != nil {
		return err
	}
	p, addrs, err := startProxy(proxyJob{Targets: nodes, Latency: rtt})
	if err != nil {
		return err
	}
	t.proxy = p
	t.via = make(map[string]string, len(nodes))
	for i, n := range nodes {
		t.via[n] = addrs[i]
	}
	t.latency = rtt
	rdb := t.client(nil)
	defer rdb.Close()
	if t.pingVia, err = pingTime(ctx, rdb); err != nil {
		return fmt.Errorf("bench: PING through the proxy: %w", err)
	}
	if t.pingDirect, err = pingTime(ctx, t.clock); err != nil {
		return fmt.Errorf("bench: PING: %w", err)
	}
	return nil
}

// Latency returns the round trip AddLatency added, 0 if none.
func (t *Target) Latency() time.Duration { return t.latency }

// nodes returns the addresses of t's Redis nodes: its address, or on a
// Redis Cluster the seeds and every node CLUSTER SLOTS names.
func (t *Target) nodes(ctx context.Context) ([]string, error) {
	if t.kind != kindCluster {
		return slices.Clone(t.addrs), nil
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	slots, err := t.clock.ClusterSlots(ctx).Result()
	if err != nil {
		return nil, fmt.Errorf("bench: CLUSTER SLOTS: %w", err)
	}
	nodes := slices.Clone(t.addrs)
	for _, s := range slots {
		for _, n := range s.Nodes {
			if !slices.Contains(nodes, n.Addr) {
				nodes = append(nodes, n.Addr)
			}
		}
	}
	for _, n := range nodes {
		if err := redistest.CheckLoopback(n); err != nil {
			return nil, fmt.Errorf("bench: cluster node: %w", err)
		}
	}
	return nodes, nil
}

// proxyProc is the proxy process: closing its stdin stops it.
type proxyProc struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
}

// startProxy starts the proxy process on job and returns it with its
// proxies' addresses.
func startProxy(job proxyJob) (*proxyProc, []string, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, nil, fmt.Errorf("bench: %w", err)
	}
	b, err := json.Marshal(job)
	if err != nil {
		return nil, nil, err
	}
	cmd := exec.Command(exe)
	cmd.Env = append(os.Environ(), ShardEnv+"="+shardProxy)
	cmd.Stderr = os.Stderr
	cmd.SysProcAttr = sysProcAttr()
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, nil, fmt.Errorf("bench: start the proxy: %w", err)
	}
	p := &proxyProc{cmd: cmd, stdin: stdin}
	if _, err := stdin.Write(append(b, '\n')); err != nil {
		p.stop()
		return nil, nil, fmt.Errorf("bench: proxy: %w", err)
	}
	type answer struct {
		reply proxyReply
		err   error
	}
	got := make(chan answer, 1)
	go func() { // ends when the process writes its line or its stdout closes
		var a answer
		line, err := bufio.NewReader(stdout).ReadBytes('\n')
		if err == nil {
			err = json.Unmarshal(line, &a.reply)
		}
		a.err = err
		got <- a
		io.Copy(io.Discard, stdout)
	}()
	timer := time.NewTimer(proxyWait)
	defer timer.Stop()
	select {
	case a := <-got:
		switch {
		case a.err != nil:
			err = fmt.Errorf("bench: proxy: %w", a.err)
		case a.reply.Error != "":
			err = fmt.Errorf("bench: proxy: %s", a.reply.Error)
		case len(a.reply.Addrs) != len(job.Targets):
			err = fmt.Errorf("bench: proxy: %d addresses for %d targets", len(a.reply.Addrs), len(job.Targets))
		default:
			return p, a.reply.Addrs, nil
		}
	case <-timer.C:
		err = fmt.Errorf("bench: proxy not started within %v", proxyWait)
	}
	p.stop()
	return nil, nil, err
}

// stop closes the process's stdin, which stops it, and waits for it.
func (p *proxyProc) stop() error {
	p.stdin.Close()
	done := make(chan error, 1)
	go func() { done <- p.cmd.Wait() }()
	timer := time.NewTimer(proxyWait)
	defer timer.Stop()
	select {
	case err := <-done:
		if err != nil {
			return fmt.Errorf("bench: proxy: %w", err)
		}
		return nil
	case <-timer.C:
		p.cmd.Process.Kill()
		<-done
		return fmt.Errorf("bench: proxy not stopped within %v: killed", proxyWait)
	}
}

// serveProxy is the proxy process: it reads a proxyJob from in, starts a
// proxy in front of each target with the job's latency, answers with their
// addresses on out, and closes them when in ends.
func serveProxy(in io.Reader, out io.Writer) error {
	lines := bufio.NewReader(in)
	line, err := lines.ReadBytes('\n')
	if err != nil {
		return fmt.Errorf("no job: %w", err)
	}
	var job proxyJob
	if err := json.Unmarshal(line, &job); err != nil {
		return fmt.Errorf("job: %w", err)
	}
	var (
		proxies []*redistest.Proxy
		reply   proxyReply
	)
	defer func() {
		for _, p := range proxies {
			p.Close()
		}
	}()
	for _, target := range job.Targets {
		p, err := redistest.StartProxy(target)
		if err != nil {
			reply = proxyReply{Error: err.Error()}
			break
		}
		p.SetLatency(job.Latency/2, job.Latency-job.Latency/2)
		proxies = append(proxies, p)
		reply.Addrs = append(reply.Addrs, p.Addr())
	}
	b, err := json.Marshal(reply)
	if err != nil {
		return err
	}
	if _, err := out.Write(append(b, '\n')); err != nil {
		return err
	}
	if reply.Error != "" {
		return nil // said so
	}
	io.Copy(io.Discard, lines) // until the parent closes it, or is gone
	return nil
}

// viaDialer returns the go-redis dialer of a client of a Target: a loopback
// one, which dials each address's proxy if via is not nil.
func viaDialer(via map[string]string) func(ctx context.Context, network, addr string) (net.Conn, error) {
	dial := redistest.LoopbackDialer(5 * time.Second)
	if via == nil {
		return dial
	}
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		p, ok := via[addr]
		if !ok {
			return nil, fmt.Errorf("bench: no proxy in front of %s (known: %s)", addr, strings.Join(slices.Sorted(maps.Keys(via)), ", "))
		}
		return dial(ctx, network, p)
	}
}

// pingTime returns the median duration of pingSamples PINGs on rdb, after
// one to connect.
func pingTime(ctx context.Context, rdb redis.UniversalClient) (time.Duration, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := rdb.Ping(ctx).Err(); err != nil {
		return 0, err
	}
	d := make([]time.Duration, pingSamples)
	for i := range d {
		start := time.Now()
		if err := rdb.Ping(ctx).Err(); err != nil {
			return 0, err
		}
		d[i] = time.Since(start)
	}
	slices.Sort(d)
	return d[len(d)/2], nil
}

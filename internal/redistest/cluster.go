package redistest

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

const (
	// clusterNodes is the number of masters in a cluster.
	clusterNodes = 3
	// maxClusterReplicas is the largest ClusterOptions.Replicas.
	maxClusterReplicas = 1
	// defaultNodeTimeout is the default ClusterOptions.NodeTimeout.
	defaultNodeTimeout = 5 * time.Second
	// busOffset is the distance from a node's port to its cluster bus port.
	busOffset = 10000
	// createTimeout bounds redis-cli --cluster create, once.
	createTimeout = 30 * time.Second
	// createAttempts is how many clusters StartCluster starts, on new
	// ports each, before it gives up: a join can hang on a bus port that
	// something took between the check and the bind.
	createAttempts = 3
	// clusterTimeout bounds the wait for every node to report cluster_state:ok.
	clusterTimeout = 30 * time.Second
)

// ClusterOptions configures StartCluster. A zero field means its default.
type ClusterOptions struct {
	Args        []string      // extra redis-server arguments for every node
	Replicas    int           // replicas per master: 0 or 1
	NodeTimeout time.Duration // cluster-node-timeout; 0 means 5 s
}

// ClusterProc is a Redis Cluster of three masters on 127.0.0.1, each with
// ClusterOptions.Replicas replicas, or a cluster given by address that this
// process does not own. Create one with StartCluster; the zero value is not
// usable. Its methods are safe for concurrent use.
type ClusterProc struct {
	nodes []*Proc

	mu      sync.Mutex // protects stopped and replica
	stopped bool
	replica map[string]string // master node ID -> address of its replica last listed in CLUSTER NODES
}

// StartCluster starts three cluster-enabled redis-server processes, six with
// Replicas 1, on free ports p whose bus ports p+10000 are free too, joins
// them with redis-cli --cluster create (--cluster-replicas opts.Replicas),
// and waits as WaitOK does: until every node reports cluster_state:ok with
// all 16384 slots served and every replica its link to its master up. With
// replicas, every node runs with repl-diskless-sync-delay 0 before opts.Args,
// so that a master syncs a new replica at once. redis-cli picks which node
// replicates which master: Masters, Replicas and ReplicaOf read it back. The
// caller must call Stop.
//
// A cluster whose join fails or hangs past 30 s is stopped, and another is
// started on other ports, three times at most: under load, a bus port found
// free was once taken before its node bound it (or so it looked: redis-cli
// waited a minute for the nodes to join, and was killed).
//
// Measured on 2 cores (Redis 7.0): six nodes start in about 2.1 s, as three
// do, nearly all of it redis-cli waiting in one-second steps for the nodes to
// agree.
func StartCluster(opts ClusterOptions) (*ClusterProc, error) {
	if opts.Replicas < 0 || opts.Replicas > maxClusterReplicas {
		return nil, fmt.Errorf("redistest: Replicas %d, want 0 to %d", opts.Replicas, maxClusterReplicas)
	}
	timeout := opts.NodeTimeout
	if timeout == 0 {
		timeout = defaultNodeTimeout
	}
	if timeout < time.Millisecond {
		return nil, fmt.Errorf("redistest: NodeTimeout %v must be at least 1ms", opts.NodeTimeout)
	}
	cli, err := exec.LookPath("redis-cli")
	if err != nil {
		return nil, fmt.Errorf("redistest: %w", err)
	}
	args := []string{
		"--cluster-enabled", "yes",
		"--cluster-config-file", "nodes.conf",
		"--cluster-node-timeout", strconv.FormatInt(timeout.Milliseconds(), 10),
	}
	if opts.Replicas > 0 {
		// A master waits repl-diskless-sync-delay (5 s by default) for more
		// replicas before it sends its first full sync; a replica promoted by
		// a failover is a master too.
		args = append(args, "--repl-diskless-sync-delay", "0")
	}
	args = append(args, opts.Args...)
	var errs []error
	for range createAttempts {
		c, err := startCluster(opts, cli, args)
		if err == nil {
			return c, nil
		}
		errs = append(errs, err)
		if errors.Is(err, errNodeStart) {
			break // start retries ports itself: another attempt would fail alike
		}
	}
	return nil, errors.Join(errs...)
}

// errNodeStart marks a cluster whose nodes did not start.
var errNodeStart = errors.New("a node did not start")

// joinCluster runs redis-cli --cluster create on the nodes at addrs, with
// replicas replicas a master, within ctx, and returns its output. A test
// makes it fail.
var joinCluster = func(ctx context.Context, cli string, addrs []string, replicas int) ([]byte, error) {
	create := []string{"--cluster", "create"}
	create = append(create, addrs...)
	create = append(create, "--cluster-replicas", strconv.Itoa(replicas), "--cluster-yes")
	cmd := exec.CommandContext(ctx, cli, create...)
	cmd.SysProcAttr = sysProcAttr()
	return cmd.CombinedOutput()
}

// startCluster is one attempt of StartCluster: the nodes with args, joined
// by cli, or none running and an error.
func startCluster(opts ClusterOptions, cli string, args []string) (*ClusterProc, error) {
	c := &ClusterProc{}
	for range clusterNodes * (1 + opts.Replicas) {
		p, err := start(Options{Args: args}, freeClusterPort)
		if err != nil {
			c.Stop()
			return nil, fmt.Errorf("%w: %w", errNodeStart, err)
		}
		c.nodes = append(c.nodes, p)
	}

	ctx, cancel := context.WithTimeout(context.Background(), createTimeout)
	defer cancel()
	if out, err := joinCluster(ctx, cli, c.Addrs(), opts.Replicas); err != nil {
		c.Stop()
		return nil, fmt.Errorf("redistest: redis-cli --cluster create: %w; output:\n%s", err, bytes.TrimSpace(out))
	}
	if err := c.WaitOK(); err != nil {
		c.Stop()
		return nil, err
	}
	return c, nil
}

// WaitOK polls every node that runs (every node of a cluster not owned)
// until each reports cluster_state:ok and all slots served in CLUSTER INFO,
// calls itself in CLUSTER NODES a master that serves slots or a replica, and,
// if a replica, reports master_link_status:up in INFO replication, and until
// each lists every other as that one lists itself (master or replica, of
// which master, with how many slots), or 30 s pass: after a node was
// restarted, say. A node that was killed and not restarted is left out.
func (c *ClusterProc) WaitOK() error {
	deadline := time.Now().Add(clusterTimeout)
	for {
		_, err := c.settled()
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("redistest: cluster after %v: %w", clusterTimeout, err)
		}
		time.Sleep(10 * pollInterval)
	}
	// Remember which replica serves which master, for WaitPromoted.
	if _, err := c.layout(); err != nil {
		return fmt.Errorf("redistest: %w", err)
	}
	return nil
}

// settled returns nil and the CLUSTER NODES of every running node, by
// address, if every running node is ok (nodeOK) and lists every running
// node as that node lists itself; else an error that says what is missing.
func (c *ClusterProc) settled() (map[string][]clusterNode, error) {
	views := make(map[string][]clusterNode)
	selves := make(map[string]clusterNode)
	for _, p := range c.nodes {
		if !p.running() {
			continue
		}
		view, err := nodeOK(p.addr)
		if err != nil {
			return nil, fmt.Errorf("node %s: %w", p.addr, err)
		}
		views[p.addr] = view
		for _, n := range view {
			if n.myself {
				selves[p.addr] = n
			}
		}
	}
	for addr, view := range views {
		for _, n := range view {
			self, ok := selves[n.addr]
			if !ok || n.myself {
				continue
			}
			if n.master != self.master || n.replica != self.replica || n.masterID != self.masterID || n.slots != self.slots {
				return nil, fmt.Errorf("node %s lists %s as %s, which lists itself as %s", addr, n.addr, n.role(), self.role())
			}
		}
	}
	return views, nil
}

// nodeOK returns the CLUSTER NODES of the node at addr if it reports
// cluster_state:ok with all slots served, is a master that serves slots or
// a replica, and as a replica has its link to its master up; else an error
// that says what is missing.
func nodeOK(addr string) ([]clusterNode, error) {
	info, err := command(addr, probeTimeout, "CLUSTER", "INFO")
	if err != nil {
		return nil, err
	}
	if !strings.Contains(info, "cluster_state:ok\r\n") || !strings.Contains(info, "cluster_slots_ok:16384\r\n") {
		return nil, errors.New("not ready:\n" + strings.TrimSpace(info))
	}
	reply, err := command(addr, probeTimeout, "CLUSTER", "NODES")
	if err != nil {
		return nil, err
	}
	view := parseClusterNodes(reply)
	i := slices.IndexFunc(view, func(n clusterNode) bool { return n.myself })
	switch {
	case i < 0:
		return nil, errors.New("CLUSTER NODES has no line for myself:\n" + strings.TrimSpace(reply))
	case view[i].master && view[i].slots == 0:
		return nil, errors.New("a master without slots, not yet a replica")
	case view[i].master:
		return view, nil
	case !view[i].replica:
		return nil, errors.New("neither master nor replica:\n" + strings.TrimSpace(reply))
	}
	repl, err := command(addr, probeTimeout, "INFO", "replication")
	if err != nil {
		return nil, err
	}
	if v, _ := infoValue(repl, "master_link_status"); v != "up" {
		return nil, errors.New("replica not linked to its master:\n" + strings.TrimSpace(repl))
	}
	return view, nil
}

// freeClusterPort returns a port p on 127.0.0.1 such that p and p+10000 were
// free a moment ago.
func freeClusterPort() (int, error) {
	for range 100 {
		p, err := freePort()
		if err != nil {
			return 0, err
		}
		if p+busOffset <= 65535 && portFree(p+busOffset) {
			return p, nil
		}
	}
	return 0, errors.New("redistest: no free port p with p+10000 free")
}

// Addrs returns the addresses of the nodes, "127.0.0.1:port" for a cluster
// started here.
func (c *ClusterProc) Addrs() []string {
	addrs := make([]string, len(c.nodes))
	for i, p := range c.nodes {
		addrs[i] = p.addr
	}
	return addrs
}

// Nodes returns the nodes, which can be killed and restarted one by one
// when the cluster was started here.
func (c *ClusterProc) Nodes() []*Proc {
	return append([]*Proc(nil), c.nodes...)
}

// Owned reports whether the cluster's processes were started here.
func (c *ClusterProc) Owned() bool {
	return len(c.nodes) > 0 && c.nodes[0].owned
}

// Stop stops every node and removes their directories. Stopping twice, or
// stopping a cluster that is not owned, does nothing.
func (c *ClusterProc) Stop() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.stopped {
		return nil
	}
	c.stopped = true
	var errs []error
	for _, p := range c.nodes {
		errs = append(errs, p.Stop())
	}
	return errors.Join(errs...)
}

// clusterNode is one line of a CLUSTER NODES reply.
type clusterNode struct {
	id       string
	addr     string // "ip:port", without the bus port
	myself   bool
	master   bool
	replica  bool
	masterID string // the master's node ID for a replica, else ""
	slots    int    // number of slots served
}

// role describes n's role: "a master of N slots", "a replica of ID" or
// "neither master nor replica".
func (n clusterNode) role() string {
	switch {
	case n.master:
		return fmt.Sprintf("a master of %d slots", n.slots)
	case n.replica:
		return "a replica of " + cmp.Or(n.masterID, "no master")
	}
	return "neither master nor replica"
}

// parseClusterNodes parses a CLUSTER NODES reply. A line without an address
// (a node in handshake, or one whose address is not known yet) is skipped.
func parseClusterNodes(reply string) []clusterNode {
	var nodes []clusterNode
	for line := range strings.Lines(reply) {
		f := strings.Fields(line)
		if len(f) < 8 {
			continue
		}
		addr, _, _ := strings.Cut(f[1], "@")
		if host, port, ok := strings.Cut(addr, ":"); !ok || host == "" || port == "0" {
			continue
		}
		n := clusterNode{id: f[0], addr: addr}
		for flag := range strings.SplitSeq(f[2], ",") {
			switch flag {
			case "myself":
				n.myself = true
			case "master":
				n.master = true
			case "slave":
				n.replica = true
			case "handshake", "noaddr":
				n.addr = ""
			}
		}
		if n.addr == "" {
			continue
		}
		if n.replica && f[3] != "-" {
			n.masterID = f[3]
		}
		for _, r := range f[8:] {
			if strings.HasPrefix(r, "[") {
				continue // a slot being migrated or imported
			}
			lo, hi, isRange := strings.Cut(r, "-")
			if !isRange {
				hi = lo
			}
			a, err1 := strconv.Atoi(lo)
			b, err2 := strconv.Atoi(hi)
			if err1 == nil && err2 == nil && b >= a {
				n.slots += b - a + 1
			}
		}
		nodes = append(nodes, n)
	}
	return nodes
}

// layout returns CLUSTER NODES as the first running node that answers sees
// it, and remembers for every master the replica it lists.
func (c *ClusterProc) layout() ([]clusterNode, error) {
	var errs []error
	for _, p := range c.nodes {
		if !p.running() {
			continue
		}
		reply, err := command(p.addr, probeTimeout, "CLUSTER", "NODES")
		if err != nil {
			errs = append(errs, fmt.Errorf("CLUSTER NODES on %s: %w", p.addr, err))
			continue
		}
		nodes := parseClusterNodes(reply)
		c.mu.Lock()
		if c.replica == nil {
			c.replica = make(map[string]string)
		}
		for _, n := range nodes {
			if n.masterID != "" {
				c.replica[n.masterID] = n.addr
			}
		}
		c.mu.Unlock()
		return nodes, nil
	}
	if len(errs) == 0 {
		return nil, errors.New("no cluster node runs")
	}
	return nil, errors.Join(errs...)
}

// proc returns the node at addr, or for a cluster not owned a Proc for it
// if addr is a loopback address.
func (c *ClusterProc) proc(addr string) (*Proc, error) {
	for _, p := range c.nodes {
		if p.addr == addr {
			return p, nil
		}
	}
	if c.Owned() {
		return nil, fmt.Errorf("node %s is not among the nodes %v", addr, c.Addrs())
	}
	if err := CheckLoopback(addr); err != nil {
		return nil, err
	}
	return external(addr), nil
}

// procs returns the nodes of the lines in nodes for which keep is true, in
// the order of Nodes (nodes of a cluster not owned that Nodes lacks last).
func (c *ClusterProc) procs(nodes []clusterNode, keep func(clusterNode) bool) ([]*Proc, error) {
	var ps []*Proc
	for _, n := range nodes {
		if !keep(n) {
			continue
		}
		p, err := c.proc(n.addr)
		if err != nil {
			return nil, fmt.Errorf("redistest: %w", err)
		}
		ps = append(ps, p)
	}
	index := func(p *Proc) int {
		if i := slices.Index(c.nodes, p); i >= 0 {
			return i
		}
		return len(c.nodes)
	}
	slices.SortStableFunc(ps, func(a, b *Proc) int {
		return cmp.Or(cmp.Compare(index(a), index(b)), strings.Compare(a.addr, b.addr))
	})
	return ps, nil
}

// find returns the line of nodes for addr.
func find(nodes []clusterNode, addr string) (clusterNode, error) {
	for _, n := range nodes {
		if n.addr == addr {
			return n, nil
		}
	}
	return clusterNode{}, fmt.Errorf("CLUSTER NODES does not list %s", addr)
}

// Masters returns the masters that serve slots, in the order of Nodes, as
// CLUSTER NODES of the first running node that answers lists them: a master
// that is down but whose slots no replica has taken over yet is one, a
// master whose replica took over is not. For a cluster without replicas that
// never failed over they are the nodes.
func (c *ClusterProc) Masters() ([]*Proc, error) {
	nodes, err := c.layout()
	if err != nil {
		return nil, fmt.Errorf("redistest: %w", err)
	}
	return c.procs(nodes, func(n clusterNode) bool { return n.master && n.slots > 0 })
}

// Replicas returns the replicas, in the order of Nodes, as CLUSTER NODES of
// the first running node that answers lists them, down or not. A killed
// master whose replica took over is neither a master nor a replica until it
// is restarted, when it comes back as a replica of the new master.
func (c *ClusterProc) Replicas() ([]*Proc, error) {
	nodes, err := c.layout()
	if err != nil {
		return nil, fmt.Errorf("redistest: %w", err)
	}
	return c.procs(nodes, func(n clusterNode) bool { return n.replica })
}

// ReplicaOf returns the replica of master, as CLUSTER NODES of the first
// running node that answers lists it (the first in the order of Nodes if
// there are several).
func (c *ClusterProc) ReplicaOf(master *Proc) (*Proc, error) {
	nodes, err := c.layout()
	if err != nil {
		return nil, fmt.Errorf("redistest: %w", err)
	}
	m, err := find(nodes, master.addr)
	if err != nil {
		return nil, fmt.Errorf("redistest: %w", err)
	}
	ps, err := c.procs(nodes, func(n clusterNode) bool { return n.masterID == m.id })
	if err != nil {
		return nil, err
	}
	if len(ps) == 0 {
		return nil, fmt.Errorf("redistest: master %s has no replica", master.addr)
	}
	return ps[0], nil
}

// Failover sends CLUSTER FAILOVER to replica, a manual failover that its
// master takes part in, so no write is lost, and waits until replica
// reports role:master in INFO replication, every running node lists it as a
// master that serves slots and its old master as one that serves none, and
// every running node is ok as WaitOK wants it (the old master a replica of
// replica with its link up), or 30 s pass.
//
// Measured on 2 cores (Redis 7.0): 0.06 to 0.5 s.
func (c *ClusterProc) Failover(replica *Proc) error {
	nodes, err := c.layout()
	if err != nil {
		return fmt.Errorf("redistest: failover to %s: %w", replica.addr, err)
	}
	n, err := find(nodes, replica.addr)
	if err != nil {
		return fmt.Errorf("redistest: failover to %s: %w", replica.addr, err)
	}
	if n.masterID == "" {
		return fmt.Errorf("redistest: failover to %s: not a replica", replica.addr)
	}
	reply, err := command(replica.addr, commandTimeout, "CLUSTER", "FAILOVER")
	if err == nil && reply != "OK" {
		err = fmt.Errorf("reply %q, want OK", reply)
	}
	if err != nil {
		return fmt.Errorf("redistest: CLUSTER FAILOVER on %s: %w", replica.addr, err)
	}
	if err := c.waitMaster(replica, n.masterID, clusterTimeout); err != nil {
		return fmt.Errorf("redistest: failover to %s after %v: %w", replica.addr, clusterTimeout, err)
	}
	return nil
}

// WaitPromoted waits, after the master old was killed, until the replica it
// had reports role:master in INFO replication, every running node lists
// that replica as a master that serves slots and old as one that serves
// none, and every running node is ok as WaitOK wants it, or timeout passes.
// It returns the new master. The replica is the one CLUSTER NODES lists for
// old now or, if it took over already, the one it listed the last time the
// cluster was asked (StartCluster, WaitOK, Masters, Replicas, ReplicaOf,
// Failover).
//
// Measured on 2 cores (Redis 7.0) with NodeTimeout 1 s: it returns about
// 2.4 s (2.2 to 2.6 s) after the kill. A go-redis ClusterClient does not
// reload its slot map when it cannot reach the killed master, only every
// ClusterStateReloadInterval (60 s): call its ReloadState.
func (c *ClusterProc) WaitPromoted(old *Proc, timeout time.Duration) (*Proc, error) {
	nodes, err := c.layout()
	if err != nil {
		return nil, fmt.Errorf("redistest: promotion of a replica of %s: %w", old.addr, err)
	}
	o, err := find(nodes, old.addr)
	if err != nil {
		return nil, fmt.Errorf("redistest: promotion of a replica of %s: %w", old.addr, err)
	}
	c.mu.Lock()
	addr, ok := c.replica[o.id]
	c.mu.Unlock()
	if !ok {
		return nil, fmt.Errorf("redistest: promotion of a replica of %s: no replica of it known", old.addr)
	}
	p, err := c.proc(addr)
	if err != nil {
		return nil, fmt.Errorf("redistest: promotion of a replica of %s: %w", old.addr, err)
	}
	if err := c.waitMaster(p, o.id, timeout); err != nil {
		return nil, fmt.Errorf("redistest: promotion of %s, replica of %s, after %v: %w", p.addr, old.addr, timeout, err)
	}
	return p, nil
}

// waitMaster polls until promoted(p, oldID) holds or timeout passes, and
// then reads the layout again so that ReplicaOf and WaitPromoted know it.
func (c *ClusterProc) waitMaster(p *Proc, oldID string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		err := c.promoted(p, oldID)
		if err == nil {
			_, err = c.layout()
			return err
		}
		if time.Now().After(deadline) {
			return err
		}
		time.Sleep(10 * pollInterval)
	}
}

// promoted returns nil if p reports role:master, the cluster is settled
// (every running node ok and all agreeing), and every running node lists p
// as a master that serves slots and the node oldID as one that serves none;
// else an error that says what is missing.
func (c *ClusterProc) promoted(p *Proc, oldID string) error {
	info, err := command(p.addr, probeTimeout, "INFO", "replication")
	if err != nil {
		return fmt.Errorf("%s: %w", p.addr, err)
	}
	if role, _ := infoValue(info, "role"); role != "master" {
		return fmt.Errorf("%s reports role:%s", p.addr, role)
	}
	views, err := c.settled()
	if err != nil {
		return err
	}
	for addr, view := range views {
		for _, n := range view {
			if n.addr == p.addr && (!n.master || n.slots == 0) {
				return fmt.Errorf("%s lists %s as %s", addr, p.addr, n.role())
			}
			if n.id == oldID && n.slots > 0 {
				return fmt.Errorf("%s still lists %s with %d slots", addr, n.addr, n.slots)
			}
		}
	}
	return nil
}

// running reports whether p's process runs: started and neither killed,
// exited nor stopped. A Proc not owned counts as running.
func (p *Proc) running() bool {
	if !p.owned {
		return true
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.stopped || p.cmd == nil {
		return false
	}
	select {
	case <-p.exited:
		return false
	default:
		return true
	}
}

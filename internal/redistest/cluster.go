package redistest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strings"
	"sync"
	"time"
)

const (
	// clusterNodes is the number of masters in a cluster.
	clusterNodes = 3
	// busOffset is the distance from a node's port to its cluster bus port.
	busOffset = 10000
	// createTimeout bounds redis-cli --cluster create.
	createTimeout = 60 * time.Second
	// clusterTimeout bounds the wait for every node to report cluster_state:ok.
	clusterTimeout = 30 * time.Second
)

// ClusterOptions configures StartCluster. A zero field means its default.
type ClusterOptions struct {
	Args []string // extra redis-server arguments for every node
}

// ClusterProc is a Redis Cluster of three masters without replicas on
// 127.0.0.1, or a cluster given by address that this process does not own.
// Create one with StartCluster; the zero value is not usable. Its methods are
// safe for concurrent use.
type ClusterProc struct {
	nodes []*Proc

	mu      sync.Mutex // protects stopped
	stopped bool
}

// StartCluster starts three cluster-enabled redis-server processes on free
// ports p whose bus ports p+10000 are free too, joins them with
// redis-cli --cluster create, and waits until every node reports
// cluster_state:ok with all 16384 slots served. The caller must call Stop.
func StartCluster(opts ClusterOptions) (*ClusterProc, error) {
	cli, err := exec.LookPath("redis-cli")
	if err != nil {
		return nil, fmt.Errorf("redistest: %w", err)
	}
	c := &ClusterProc{}
	args := append([]string{
		"--cluster-enabled", "yes",
		"--cluster-config-file", "nodes.conf",
		"--cluster-node-timeout", "5000",
	}, opts.Args...)
	for range clusterNodes {
		p, err := start(Options{Args: args}, freeClusterPort)
		if err != nil {
			c.Stop()
			return nil, err
		}
		c.nodes = append(c.nodes, p)
	}

	ctx, cancel := context.WithTimeout(context.Background(), createTimeout)
	defer cancel()
	create := []string{"--cluster", "create"}
	create = append(create, c.Addrs()...)
	create = append(create, "--cluster-replicas", "0", "--cluster-yes")
	cmd := exec.CommandContext(ctx, cli, create...)
	cmd.SysProcAttr = sysProcAttr()
	if out, err := cmd.CombinedOutput(); err != nil {
		c.Stop()
		return nil, fmt.Errorf("redistest: redis-cli --cluster create: %w; output:\n%s", err, bytes.TrimSpace(out))
	}
	if err := c.WaitOK(); err != nil {
		c.Stop()
		return nil, err
	}
	return c, nil
}

// WaitOK polls CLUSTER INFO on every node until each reports
// cluster_state:ok and all slots served, or 30 s pass: after a node was
// restarted, say.
func (c *ClusterProc) WaitOK() error {
	deadline := time.Now().Add(clusterTimeout)
	for _, p := range c.nodes {
		for {
			info, err := command(p.addr, probeTimeout, "CLUSTER", "INFO")
			if err == nil {
				if strings.Contains(info, "cluster_state:ok\r\n") && strings.Contains(info, "cluster_slots_ok:16384\r\n") {
					break
				}
				err = errors.New("not ready:\n" + strings.TrimSpace(info))
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("redistest: cluster node %s after %v: %w", p.addr, clusterTimeout, err)
			}
			time.Sleep(10 * pollInterval)
		}
	}
	return nil
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

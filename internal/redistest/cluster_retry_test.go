package redistest

import (
	"context"
	"errors"
	"net"
	"slices"
	"strings"
	"testing"
	"time"
)

// TestStartClusterRetries: a join that fails ends its attempt alone: that
// attempt's nodes are stopped, and StartCluster starts a cluster on other
// ports; after createAttempts failed joins it gives up, every node stopped,
// with every attempt's error.
func TestStartClusterRetries(t *testing.T) {
	need(t, "redis-server", "redis-cli")
	join := joinCluster
	t.Cleanup(func() { joinCluster = join })

	var tried [][]string
	failing := func(fail int) func(ctx context.Context, cli string, addrs []string, replicas int) ([]byte, error) {
		return func(ctx context.Context, cli string, addrs []string, replicas int) ([]byte, error) {
			tried = append(tried, slices.Clone(addrs))
			if len(tried) <= fail {
				return []byte("refused by the test"), errors.New("a join that failed")
			}
			return join(ctx, cli, addrs, replicas)
		}
	}
	// stopped fails the test unless nothing listens on the addresses of
	// the failed attempts that running does not hold.
	stopped := func(failed [][]string, running []string) {
		t.Helper()
		for _, addrs := range failed {
			for _, a := range addrs {
				if slices.Contains(running, a) {
					continue // a port the next attempt drew again
				}
				if c, err := net.DialTimeout("tcp", a, time.Second); err == nil {
					c.Close()
					t.Errorf("a node of a failed attempt still listens on %s", a)
				}
			}
		}
	}

	joinCluster = failing(1)
	c, err := StartCluster(ClusterOptions{})
	if err != nil {
		t.Fatalf("StartCluster after one failed join = %v, want a cluster", err)
	}
	if len(tried) != 2 || len(tried[0]) != clusterNodes {
		t.Errorf("joins tried: %v, want two of %d nodes", tried, clusterNodes)
	}
	stopped(tried[:1], c.Addrs())
	if err := c.WaitOK(); err != nil {
		t.Errorf("the second attempt's cluster: %v", err)
	}
	if err := c.Stop(); err != nil {
		t.Fatal(err)
	}

	tried = nil
	joinCluster = failing(createAttempts)
	if c, err := StartCluster(ClusterOptions{}); err == nil {
		c.Stop()
		t.Fatalf("StartCluster with every join failing = a cluster, want an error")
	} else if n := strings.Count(err.Error(), "a join that failed"); n != createAttempts || len(tried) != createAttempts {
		t.Errorf("StartCluster with every join failing: %d joins, error %v; want %d of each", len(tried), err, createAttempts)
	}
	stopped(tried, nil)
}

package hybrid_test

import (
	"context"
	"testing"
	"time"

	"github.com/hybridlimit/hybrid/global"
	"github.com/hybridlimit/hybrid/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// clusterTopology is a Redis Cluster of three masters with a replica each,
// whose nodes give up on a silent node after one second.
type clusterTopology struct{ c *redistest.ClusterProc }

func newClusterTopology(t *testing.T) clusterTopology {
	return clusterTopology{redistest.ClusterWith(t, redistest.ClusterOptions{Replicas: 1, NodeTimeout: time.Second})}
}

func (ct clusterTopology) client(t *testing.T) redis.UniversalClient {
	return redistest.ClusterClient(t, ct.c)
}

func (ct clusterTopology) master(t *testing.T) *redistest.Proc {
	rdb := redistest.ClusterClient(t, ct.c)
	mc, err := rdb.MasterForKey(context.Background(), global.DefaultPrefix+":{hot}")
	if err != nil {
		t.Fatal(err)
	}
	masters, err := ct.c.Masters()
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range masters {
		if m.Addr() == mc.Options().Addr {
			return m
		}
	}
	t.Fatalf("the hot key's master %s is not among the masters", mc.Options().Addr)
	return nil
}

func (ct clusterTopology) replicas(t *testing.T, m *redistest.Proc) []*redistest.Proc {
	r, err := ct.c.ReplicaOf(m)
	if err != nil {
		t.Fatal(err)
	}
	return []*redistest.Proc{r}
}

func (ct clusterTopology) handover(t *testing.T, m *redistest.Proc) {
	if err := ct.c.Failover(ct.replicas(t, m)[0]); err != nil {
		t.Fatal(err)
	}
}

func (ct clusterTopology) promoted(t *testing.T, m *redistest.Proc) {
	if _, err := ct.c.WaitPromoted(m, 30*time.Second); err != nil {
		t.Fatal(err)
	}
}

// TestFailoverCluster is TestFailoverSentinel on a Redis Cluster with a
// replica for each master: the master of the hot key's bucket killed with
// SIGKILL (lease, optimistic, exact), handed over by CLUSTER FAILOVER, and
// killed after its replica missed 1.5 s of its writes (lease). The other
// masters, the one of the fleet count among them, keep running.
func TestFailoverCluster(t *testing.T) {
	failoverCases(t, func(t *testing.T) foTopology { return newClusterTopology(t) })
}

package hybrid_test

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"testing"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/hybridlimit/hybrid"
)

// TestClientWarning: New logs one warning for a client whose context
// deadlines do not reach the socket (go-redis's default), for a plain, a
// failover and a cluster client, and none for one that has
// ContextTimeoutEnabled.
func TestClientWarning(t *testing.T) {
	m := miniredis.RunT(t)
	tests := []struct {
		name string
		rdb  redis.UniversalClient
		warn bool
	}{
		{"default", redis.NewClient(&redis.Options{Addr: m.Addr()}), true},
		{"ContextTimeoutEnabled", redis.NewClient(&redis.Options{Addr: m.Addr(), ContextTimeoutEnabled: true}), false},
		{"cluster default", redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{m.Addr()}}), true},
		{"cluster ContextTimeoutEnabled", redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{m.Addr()}, ContextTimeoutEnabled: true}), false},
		{"failover default", redis.NewFailoverClient(&redis.FailoverOptions{MasterName: "m", SentinelAddrs: []string{m.Addr()}}), true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			defer tt.rdb.Close()
			var buf bytes.Buffer
			l, err := hybrid.New(tt.rdb, hybrid.Config{Logger: slog.New(slog.NewTextHandler(&buf, nil))})
			if err != nil {
				t.Fatal(err)
			}
			l.Close(context.Background())
			got := strings.Count(buf.String(), "ContextTimeoutEnabled is false")
			if want := map[bool]int{true: 1, false: 0}[tt.warn]; got != want {
				t.Errorf("%d warnings about ContextTimeoutEnabled, want %d; log:\n%s", got, want, buf.String())
			}
		})
	}
}

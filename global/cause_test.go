package global_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/hybridlimit/hybrid/global"
	"github.com/hybridlimit/hybrid/internal/redistest"
)

// TestCauseOf: the error replies by which a node refuses every call alike,
// as redis-server 7.0 words them (a write refused inside a script keeps its
// code and names the script) and as Redis 6 wraps them in a script error,
// wrapped or not, have their cause; other error replies and errors without
// a reply have none.
func TestCauseOf(t *testing.T) {
	reply := func(msg string) error { return proto(msg) }
	tests := []struct {
		err  error
		want global.Cause
	}{
		{reply("OOM command not allowed when used memory > 'maxmemory'."), global.Full},
		{reply("OOM command not allowed when used memory > 'maxmemory'. script: 9e6769c9edcae33737e9e9d049ec00d7cc07d648, on @user_script:1."), global.Full},
		{reply("ERR Error running script (call to f_9e6769c9edcae33737e9e9d049ec00d7cc07d648): @user_script:1: @user_script: 1: -OOM command not allowed when used memory > 'maxmemory'. "), global.Full},
		{fmt.Errorf("global: settle %q: %w", "k", reply("OOM command not allowed when used memory > 'maxmemory'.")), global.Full},
		{reply("READONLY You can't write against a read only replica."), global.ReadOnly},
		{reply("READONLY You can't write against a read only replica. script: 9e6769c9edcae33737e9e9d049ec00d7cc07d648, on @user_script:1."), global.ReadOnly},
		{reply("ERR Error running script (call to f_9e6769c9edcae33737e9e9d049ec00d7cc07d648): @user_script:1: @user_script: 1: -READONLY You can't write against a read only replica. "), global.ReadOnly},
		{reply("MASTERDOWN Link with MASTER is down and replica-serve-stale-data is set to 'no'."), global.MasterDown},
		{reply("MISCONF Redis is configured to save RDB snapshots, but it's currently unable to persist to disk. Commands that may modify the data set are disabled, because this instance is configured to report errors during writes if RDB snapshotting fails (stop-writes-on-bgsave-error option). Please check the Redis logs for details about the RDB error."), global.Unpersisted},
		{reply("NOAUTH Authentication required."), global.Refused},
		{reply("WRONGPASS invalid username-password pair or user is disabled."), global.Refused},
		{fmt.Errorf("global: settle %q: %w", "k", reply("NOPERM no permissions")), global.Refused},
		{reply("ERR hybrid: rate 0 is not an integer in [1, 1125899906842624]"), global.NoCause},
		{reply("ERR hybrid: key -OOM is not an OOM"), global.NoCause},
		{reply("WRONGTYPE Operation against a key holding the wrong kind of value"), global.NoCause},
		{reply("NOSCRIPT No matching script. Please use EVAL."), global.NoCause},
		{reply("LOADING Redis is loading the dataset in memory"), global.NoCause},
		{errors.New("OOM command not allowed, but not a reply"), global.NoCause},
		{context.DeadlineExceeded, global.NoCause},
		{nil, global.NoCause},
	}
	for _, tt := range tests {
		if got := global.CauseOf(tt.err); got != tt.want {
			t.Errorf("CauseOf(%v) = %q, want %q", tt.err, got, tt.want)
		}
	}
}

// TestCauseString: each cause has a name, which the log and the metrics
// use.
func TestCauseString(t *testing.T) {
	want := [global.Causes]string{"", "refused", "maxmemory", "readonly", "masterdown", "misconf"}
	for c := range global.Causes {
		if got := global.Cause(c).String(); got != want[c] {
			t.Errorf("Cause(%d).String() = %q, want %q", c, got, want[c])
		}
	}
}

// TestCauseRedis: a real redis-server whose memory is past maxmemory
// (noeviction) refuses the settlement script's writes with an OOM reply,
// and a read-only replica with a READONLY reply, through every call of the
// package: a settlement alone, a multi-key call, a decision (Allow), a
// heartbeat. Each error has its cause.
func TestCauseRedis(t *testing.T) {
	ctx := t.Context()
	master := redistest.Server(t)
	if !master.Owned() {
		t.Skip("REDIS_ADDR names a shared server this test would fill")
	}
	mrdb := redistest.Client(t, master)
	replica := redistest.Server(t)
	rrdb := redistest.Client(t, replica)
	host, port, err := net.SplitHostPort(master.Addr())
	if err != nil {
		t.Fatal(err)
	}
	if err := rrdb.ReplicaOf(ctx, host, port).Err(); err != nil {
		t.Fatalf("REPLICAOF %s: %v", master.Addr(), err)
	}
	// Any memory in use is past a maxmemory of one byte.
	if err := mrdb.ConfigSet(ctx, "maxmemory", "1").Err(); err != nil {
		t.Fatalf("CONFIG SET maxmemory 1: %v", err)
	}
	for _, tt := range []struct {
		name string
		rdb  *redis.Client
		want global.Cause
	}{
		{"full master", mrdb, global.Full},
		{"replica", rrdb, global.ReadOnly},
	} {
		t.Run(tt.name, func(t *testing.T) {
			l, err := global.New(tt.rdb, global.Config{Prefix: "cause"})
			if err != nil {
				t.Fatal(err)
			}
			lim := global.Limit{Rate: 1, Burst: 5}
			m, _ := lim.Micro()
			for _, n := range []int{1, 3} {
				batch := make([]global.Settlement, n)
				for i := range batch {
					batch[i] = global.Settlement{Key: "k" + strconv.Itoa(i), Limit: m, Want: 1_000_000}
				}
				replies := make([]global.Reply, n)
				if err := l.Settle(ctx, batch, replies); err != nil {
					t.Fatalf("Settle of %d keys = %v, want the errors in the replies", n, err)
				}
				for i, rep := range replies {
					if got := global.CauseOf(rep.Err); got != tt.want {
						t.Errorf("Settle of %d keys: reply %d error %v, cause %q; want %q", n, i, rep.Err, got, tt.want)
					}
				}
			}
			_, err = l.Allow(ctx, "k", lim, 1)
			if got := global.CauseOf(err); got != tt.want {
				t.Errorf("Allow = %v, cause %q; want %q", err, got, tt.want)
			}
			_, _, err = l.Heartbeat(ctx, "id", time.Second)
			if got := global.CauseOf(err); got != tt.want {
				t.Errorf("Heartbeat = %v, cause %q; want %q", err, got, tt.want)
			}
		})
	}
}

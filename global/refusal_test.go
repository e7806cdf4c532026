package global_test

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/hybridlimit/hybrid/global"
)

// TestIsRefusal: the error replies by which Redis refuses the client, as a
// real server words them, wrapped or not, are refusals; other error replies
// and errors without a reply are not.
func TestIsRefusal(t *testing.T) {
	reply := func(msg string) error { return proto(msg) }
	tests := []struct {
		err  error
		want bool
	}{
		{reply("NOAUTH Authentication required."), true},
		{reply("WRONGPASS invalid username-password pair or user is disabled."), true},
		{reply("NOPERM this user has no permissions to access one of the keys used as arguments"), true},
		{reply("NOPERM User limiter has no permissions to run the 'evalsha' command"), true},
		{reply("ERR Protocol error: unauthenticated multibulk length"), true},
		{fmt.Errorf("global: settle %q: %w", "k", reply("NOPERM no permissions")), true},
		{reply("NOSCRIPT No matching script. Please use EVAL."), false},
		{reply("WRONGTYPE Operation against a key holding the wrong kind of value"), false},
		{reply("ERR hybrid: rate 0 is not an integer in [1, 1125899906842624]"), false},
		{reply("CLUSTERDOWN The cluster is down"), false},
		{context.DeadlineExceeded, false},
		{errors.New("NOPERM but not a reply"), false},
		{nil, false},
	}
	for _, tt := range tests {
		if got := global.IsRefusal(tt.err); got != tt.want {
			t.Errorf("IsRefusal(%v) = %v, want %v", tt.err, got, tt.want)
		}
	}
}

// proto is an error reply from Redis, as go-redis returns one.
type proto string

func (e proto) Error() string { return string(e) }
func (proto) RedisError()     {}

var _ redis.Error = proto("")

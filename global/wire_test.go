package global

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"
)

// TestSettleWireReplies answers wireBatch (two keys without a seq, one
// with, in one script call) on the wire and checks what each key gets: dup
// 1 is a Duplicate for the key sent with a seq and a garbled reply for the
// others, forgiven beyond what a key's settlement charged is garbled,
// and a reply of six, five or four integers a key is garbled for every key.
func TestSettleWireReplies(t *testing.T) {
	const now = 1_700_000_000_000_000
	reply := func(v ...int64) string {
		s := fmt.Sprintf("*%d\r\n", len(v))
		for _, x := range v {
			s += fmt.Sprintf(":%d\r\n", x)
		}
		return s
	}
	type want struct {
		granted, tokens int64
		forgiven        int64
		reset, dup      bool
		garbled         bool
	}
	tests := []struct {
		name string
		raw  string
		want [3]want
	}{
		{"applied",
			reply(2_000_000, 7_000_000, now, 0, 0, 0, 0, 5_000_000, 5_000_000, now, 1, 0, 0, 0, 3_000_000, 8_000_000, now, 0, 0, 0, 0),
			[3]want{{granted: 2_000_000, tokens: 7_000_000}, {granted: 5_000_000, tokens: 5_000_000, reset: true}, {granted: 3_000_000, tokens: 8_000_000}}},
		{"duplicate",
			reply(0, 0, now, 0, 0, 0, 0, 0, 0, now, 0, 0, 0, 0, 3_000_000, -4, now, 0, 1, 0, 0),
			[3]want{{}, {}, {granted: 3_000_000, tokens: -4, dup: true}}},
		{"dup 1 without a seq",
			reply(0, 0, now, 0, 1, 0, 0, 1_000_000, 0, now, 0, 1, 0, 0, 0, 0, now, 0, 1, 0, 0),
			[3]want{{garbled: true}, {garbled: true}, {dup: true}}},
		{"dup with reset",
			reply(0, 0, now, 0, 0, 0, 0, 0, 0, now, 0, 0, 0, 0, 0, 0, now, 1, 1, 0, 0),
			[3]want{{}, {}, {garbled: true}}},
		{"forgiven",
			reply(0, -10_000_000, now, 0, 0, 500_000, 0, 0, 0, now, 0, 0, 0, 0, 0, 0, now, 0, 0, 0, 0),
			[3]want{{tokens: -10_000_000, forgiven: 500_000}, {}, {}}},
		{"forgiven beyond consumed",
			reply(0, -10_000_000, now, 0, 0, 1_000_001, 0, 0, 0, now, 0, 0, 0, 0, 0, 0, now, 0, 0, 0, 0),
			[3]want{{garbled: true}, {}, {}}},
		{"six integers, the reply before credited",
			reply(2_000_000, 7_000_000, now, 0, 0, 0, 5_000_000, 5_000_000, now, 1, 0, 0, 3_000_000, 8_000_000, now, 0, 0, 0),
			[3]want{{garbled: true}, {garbled: true}, {garbled: true}}},
		{"five integers, the reply before forgiven",
			reply(2_000_000, 7_000_000, now, 0, 0, 5_000_000, 5_000_000, now, 1, 0, 3_000_000, 8_000_000, now, 0, 0),
			[3]want{{garbled: true}, {garbled: true}, {garbled: true}}},
		{"four integers",
			reply(0, 0, now, 0, 0, 0, now, 0, 0, 0, now, 0),
			[3]want{{garbled: true}, {garbled: true}, {garbled: true}}},
	}
	for _, tt := range tests {
		l, stop := wireLimiter(t, []byte(tt.raw))
		replies := make([]Reply, len(wireBatch))
		if err := l.Settle(context.Background(), wireBatch, replies); err != nil {
			t.Errorf("%s: Settle = %v, want nil", tt.name, err)
		}
		stop()
		for i, r := range replies {
			w := tt.want[i]
			if w.garbled {
				if !errors.Is(r.Err, ErrReply) {
					t.Errorf("%s: reply %d = %+v, want %v", tt.name, i, r, ErrReply)
				}
				continue
			}
			got := Reply{Granted: r.Granted, Tokens: r.Tokens, Forgiven: r.Forgiven, Reset: r.Reset, Duplicate: r.Duplicate, Err: r.Err}
			if want := (Reply{Granted: w.granted, Tokens: w.tokens, Forgiven: w.forgiven, Reset: w.reset, Duplicate: w.dup}); got != want || !r.Now.Equal(time.UnixMicro(now)) {
				t.Errorf("%s: reply %d = %+v, want %+v at %d µs", tt.name, i, r, want, int64(now))
			}
		}
	}
}

// TestSettleWireNotIntegers: a reply that holds what go-redis cannot read
// as an integer (a string of other than digits, an array) fails its call,
// as a stream that cannot be read would: each key gets the call's error,
// not a reply's (ErrReply), and Settle says the keys got no reply. A nil
// reads as 0, which no reply's time is: that key's reply is garbled.
func TestSettleWireNotIntegers(t *testing.T) {
	const now = 1_700_000_000_000_000
	ints := func(n int) string {
		s := ""
		for range n {
			s += fmt.Sprintf(":%d\r\n", now)
		}
		return s
	}
	for name, raw := range map[string]string{
		"a string first": "*21\r\n$1\r\nx\r\n" + ints(20),
		"a string last":  "*21\r\n" + ints(20) + "$2\r\nab\r\n",
		"an array":       "*21\r\n*1\r\n:1\r\n" + ints(20),
	} {
		l, stop := wireLimiter(t, []byte(raw))
		replies := make([]Reply, len(wireBatch))
		err := l.Settle(context.Background(), wireBatch, replies)
		stop()
		if err == nil {
			t.Errorf("%s: Settle = nil, want the call's error", name)
		}
		for i, r := range replies {
			if r.Err == nil || errors.Is(r.Err, ErrReply) || r.Granted != 0 || !r.Now.IsZero() {
				t.Errorf("%s: reply %d = %+v, want the call's error, not %v", name, i, r, ErrReply)
			}
		}
	}
}

// TestSettleWireNil answers a batch whose first reply holds a nil where its
// time goes: go-redis reads it as 0, which Settle takes for a garbled
// reply (Redis TIME is never 0) and reports as that key's ErrReply, while
// the other keys' replies are read as usual.
func TestSettleWireNil(t *testing.T) {
	const now = 1_700_000_000_000_000
	raw := "*21\r\n:0\r\n:0\r\n_\r\n:0\r\n:0\r\n:0\r\n:0\r\n"
	for range 2 {
		raw += fmt.Sprintf(":0\r\n:0\r\n:%d\r\n:0\r\n:0\r\n:0\r\n:0\r\n", int64(now))
	}
	l, stop := wireLimiter(t, []byte(raw))
	defer stop()
	replies := make([]Reply, len(wireBatch))
	if err := l.Settle(context.Background(), wireBatch, replies); err != nil {
		t.Fatalf("Settle = %v", err)
	}
	if !errors.Is(replies[0].Err, ErrReply) {
		t.Errorf("reply 0, its time nil: %+v, want %v", replies[0], ErrReply)
	}
	for i := 1; i < len(replies); i++ {
		if replies[i].Err != nil {
			t.Errorf("reply %d: %v", i, replies[i].Err)
		}
	}
}

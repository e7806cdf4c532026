package global

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/redis/go-redis/v9"
)

// ErrSpread is SettleAll's error on a Redis Cluster: its keys have slots of
// their own, which one script call cannot span.
var ErrSpread = errors.New("global: all-or-nothing settlement on a Redis Cluster")

// SettleAll decides batch, decisions alone (each a Decision, or any
// Settlement with nothing consumed or returned and no Seq, each key once),
// all or nothing, in one script call: if one key's bucket cannot grant its
// MinGrant, no key is granted anything, and each Reply says what its bucket
// holds. The outcome of batch[i] goes in replies[i]. A composite decision
// (a request that must pass several limits) so takes its tokens in one round
// trip, and needs nothing given back when one limit denies.
//
// Its errors: ErrSpread on a Cluster (send the decisions one by one
// instead), an invalid settlement (ErrInvalidLimit, ErrInvalidCost,
// ErrInvalidKey), or the call failing; then no Reply is set.
func (l *Limiter) SettleAll(ctx context.Context, batch []Settlement, replies []Reply) error {
	if l.Spread() {
		return ErrSpread
	}
	if len(replies) < len(batch) {
		return fmt.Errorf("global: settle all: %d replies for %d settlements", len(replies), len(batch))
	}
	if len(batch) == 0 {
		return nil
	}
	keys := make([]string, 0, len(batch))
	args := make([]any, 0, 10*len(batch)+1)
	for i := range batch {
		s := &batch[i]
		if err := s.check(); err != nil {
			return fmt.Errorf("global: settle all %q: %w", s.Key, err)
		}
		k := l.Key(s.Key)
		if s.Consumed != 0 || s.Returned != 0 || s.Seq != 0 || !s.Since.IsZero() || slices.Contains(keys, k) {
			return fmt.Errorf("global: settle all %q: %w: decisions alone, each key once", s.Key, ErrInvalidCost)
		}
		keys = append(keys, k)
		args = s.appendArgsN(args, 10)
	}
	args = append(args, "all")
	v, err := l.script.Run(ctx, l.rdb, keys, args...).Result()
	if errors.Is(err, redis.Nil) {
		err = fmt.Errorf("%w: got nil, want %d integers", ErrReply, replyLen*len(batch))
	}
	if err != nil {
		return fmt.Errorf("global: settle all: %w", err)
	}
	a, ok := v.([]any)
	if !ok || len(a) != replyLen*len(batch) {
		return fmt.Errorf("global: settle all: %w: got %T of %d, want %d integers", ErrReply, v, len(a), replyLen*len(batch))
	}
	for i := range batch {
		r, err := parseReply(a[replyLen*i:replyLen*(i+1)], batch[i].Limit.Burst, batch[i].Want, 0, false)
		if err != nil {
			return fmt.Errorf("global: settle all %q: %w", batch[i].Key, err)
		}
		replies[i] = r
	}
	return nil
}

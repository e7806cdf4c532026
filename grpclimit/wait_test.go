package grpclimit_test

import (
	"context"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/hybridlimit/hybrid"
	"github.com/hybridlimit/hybrid/grpclimit"
)

// TestMaxWait: calls over their limit wait up to MaxWait for their tokens
// and are then served, in the order they came, within MaxWait; those whose
// tokens would come later are answered ResourceExhausted at once; a
// negative MaxWait is refused.
func TestMaxWait(t *testing.T) {
	inBubble(t, func(t *testing.T, lim *hybrid.Limiter) {
		limit := hybrid.Limit{Rate: 100, Burst: 1} // a token every 10 ms
		const each, maxWait = 10 * time.Millisecond, 50 * time.Millisecond
		if _, err := grpclimit.New(lim, grpclimit.Config{Limit: limit, MaxWait: -time.Second}); err == nil {
			t.Error("New with a negative MaxWait = nil error")
		}
		ic := newInterceptor(t, lim, grpclimit.Config{Limit: limit, MaxWait: maxWait})
		s := serve(t, ic, options{peer: tcpAddr(client)})
		start := time.Now()
		var mu sync.Mutex
		var order []int
		refused := 0
		var wg sync.WaitGroup
		for i := range 10 {
			wg.Go(func() {
				_, _, err := s.check(context.Background())
				took := time.Since(start)
				mu.Lock()
				defer mu.Unlock()
				switch status.Code(err) {
				case codes.OK:
					order = append(order, i)
					if took > maxWait {
						t.Errorf("call %d served after %v, more than MaxWait %v", i, took, maxWait)
					}
				case codes.ResourceExhausted:
					refused++
					if took != 0 {
						t.Errorf("call %d refused after %v, want at once", i, took)
					}
				default:
					t.Errorf("call %d: %v", i, err)
				}
			})
			synctest.Wait() // it has asked: the next comes after it
		}
		wg.Wait()
		want := 1 + int(maxWait/each) // the burst and a token each 10 ms
		if len(order) != want {
			t.Errorf("%d served (in the order %v), %d refused; want %d served", len(order), order, refused, want)
		}
		for i, c := range order {
			if c != i {
				t.Errorf("served in the order %v, want the order they came", order)
				break
			}
		}
		if st := ic.Stats(); st.Waited != uint64(want-1) || st.Allowed != uint64(want) || st.Denied != uint64(refused) {
			t.Errorf("Stats = %+v, want %d allowed, %d of them waited, %d denied", st, want, want-1, refused)
		}
	})
}

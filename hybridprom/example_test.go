package hybridprom_test

import (
	"bufio"
	"context"
	"fmt"
	"log"
	"net/http/httptest"
	"strings"

	"github.com/alicebob/miniredis/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/redis/go-redis/v9"

	"github.com/hybridlimit/hybrid"
	"github.com/hybridlimit/hybrid/hybridprom"
)

// Export a Limiter's metrics on a /metrics handler, and read its decisions
// back from what a scrape returns.
func Example() {
	m, err := miniredis.Run() // a Redis for the example; use your own
	if err != nil {
		log.Fatal(err)
	}
	defer m.Close()
	rdb := redis.NewClient(&redis.Options{Addr: m.Addr()})
	defer rdb.Close()
	lim, err := hybrid.New(rdb, hybrid.Config{})
	if err != nil {
		log.Fatal(err)
	}

	c, err := hybridprom.New(lim, hybridprom.Config{})
	if err != nil {
		log.Fatal(err)
	}
	reg := prometheus.NewRegistry() // or prometheus.MustRegister(c)
	reg.MustRegister(c)
	metrics := promhttp.HandlerFor(reg, promhttp.HandlerOpts{})

	// Three tokens a key: the first request of a new key is admitted at
	// once, the second learns the key's bucket from Redis, the third spends
	// this instance's budget, and the fourth and fifth are denied here,
	// with no round trip.
	perKey := hybrid.Limit{Rate: 0.001, Burst: 3, Mode: hybrid.Optimistic}
	for range 5 {
		if _, err := lim.Allow(context.Background(), "user42", perKey); err != nil {
			log.Fatal(err)
		}
	}
	// Close settles every key: the allowed decisions counted in the keys
	// are all added up now (while running, at each round).
	if err := lim.Close(context.Background()); err != nil {
		log.Fatal(err)
	}

	rec := httptest.NewRecorder()
	metrics.ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	sc := bufio.NewScanner(rec.Body)
	for sc.Scan() {
		if line := sc.Text(); strings.HasPrefix(line, "hybrid_decisions_total") && !strings.HasSuffix(line, " 0") {
			fmt.Println(line)
		}
	}
	// Output:
	// hybrid_decisions_total{result="allowed",source="local"} 2
	// hybrid_decisions_total{result="allowed",source="redis"} 1
	// hybrid_decisions_total{result="denied",source="local"} 2
}

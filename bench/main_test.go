package bench

import (
	"os"
	"testing"

	"github.com/redis/go-redis/v9"
)

// TestMain serves the shards that RunProcs starts from this test binary,
// and silences go-redis's log of the dials refused during outages.
func TestMain(m *testing.M) {
	if IsShard() {
		os.Exit(ServeShard())
	}
	redis.SetLogger(quietLogger{})
	os.Exit(m.Run())
}

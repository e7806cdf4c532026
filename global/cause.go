package global

import (
	"errors"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"
)

// Cause names why a Redis node refuses a call in a way it will refuse every
// call alike until its state or configuration changes: a node in that state
// is down for this limiter, as one that does not answer is, even though it
// answers. The zero Cause means none: the error, if any, is not such a
// refusal (a timeout, a script error, WRONGTYPE, no reply).
type Cause int8

// The causes CauseOf tells apart.
const (
	// NoCause is an error that is not such a refusal, or no error.
	NoCause Cause = iota
	// Refused is Redis refusing the client: NOAUTH, WRONGPASS, NOPERM
	// (see IsRefusal).
	Refused
	// Full is Redis refusing a write because its memory reached
	// maxmemory with the policy noeviction: OOM.
	Full
	// ReadOnly is a read-only replica refusing a write: READONLY, as one
	// left behind after a failover answers.
	ReadOnly
	// MasterDown is a replica that lost its master and is configured not
	// to serve stale data (replica-serve-stale-data no): MASTERDOWN.
	MasterDown
	// Unpersisted is Redis refusing writes because it cannot save its RDB
	// snapshots and is configured to stop writes then
	// (stop-writes-on-bgsave-error yes): MISCONF.
	Unpersisted

	// Causes is the number of causes, NoCause included: an array indexed
	// by Cause has Causes elements.
	Causes = int(Unpersisted) + 1
)

// String returns "", "refused", "maxmemory", "readonly", "masterdown" or
// "misconf".
func (c Cause) String() string {
	switch c {
	case NoCause:
		return ""
	case Refused:
		return "refused"
	case Full:
		return "maxmemory"
	case ReadOnly:
		return "readonly"
	case MasterDown:
		return "masterdown"
	case Unpersisted:
		return "misconf"
	}
	return "cause(" + strconv.Itoa(int(c)) + ")"
}

// codes are the error codes of the causes after Refused, by which a reply
// starts (Redis 7 keeps a script's first refused command's code, "OOM
// command not allowed when used memory > 'maxmemory'. script: ..."), or
// which a script error carries after a '-' ("ERR Error running script
// (call to f_...): @user_script:1: -OOM command not allowed ...", as Redis
// 6 words it).
var codes = [...]struct {
	code  string
	cause Cause
}{
	{"OOM ", Full},
	{"READONLY ", ReadOnly},
	{"MASTERDOWN ", MasterDown},
	{"MISCONF ", Unpersisted},
}

// CauseOf returns why err, an error reply from Redis, wrapped or not, is
// one that the node will give every call alike (see Cause), or NoCause. An
// OOM or READONLY reply refuses writes alone, but every settlement writes,
// so the node is down for the limiter. A circuit breaker should count a
// call that gets one as a failure, not as an answer.
func CauseOf(err error) Cause {
	if err == nil {
		return NoCause // and no allocation for errors.As's target: most replies
	}
	if IsRefusal(err) {
		return Refused
	}
	var re redis.Error
	if !errors.As(err, &re) {
		return NoCause
	}
	msg := re.Error()
	inScript := strings.HasPrefix(msg, "ERR Error running script") || strings.HasPrefix(msg, "ERR user_script")
	for _, c := range codes {
		if strings.HasPrefix(msg, c.code) || inScript && strings.Contains(msg, "-"+c.code) {
			return c.cause
		}
	}
	return NoCause
}

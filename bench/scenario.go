package bench

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/hybridlimit/hybrid"
	"github.com/hybridlimit/hybrid/internal/plural"
)

// Scenario is a simulated fleet and its load. A zero field means its
// documented default, so the zero Scenario is one hot key asked for at 4x
// its limit of 1000/s by 8 instances for 10 s.
type Scenario struct {
	// Instances is the fleet size. 0 means 8.
	Instances int
	// Duration is how long requests arrive. 0 means 10s. In a long tail
	// (Passes) it only bounds the run, which ends when every ask is done;
	// 0 means 10m then.
	Duration time.Duration
	// Keys is how many keys are asked for. 0 means 1, a hot key.
	Keys int
	// Dist is how a request's key is drawn: Uniform or Zipf. "" means
	// Uniform.
	Dist string
	// ZipfS is the exponent s > 1 of Zipf: key i (from 0) is drawn with a
	// probability proportional to (1+i)^-s. 0 means 1.1.
	ZipfS float64
	// Demand is the load as a multiple of the sum of the keys' limits: the
	// fleet asks for Demand * Rate * Keys tokens per second. 0 means 4.
	Demand float64
	// Rate is every key's limit in tokens per second. 0 means 1000.
	Rate float64
	// Burst is every key's burst in tokens. 0 means 1000.
	Burst int64
	// Cost is the tokens each request takes, at most Burst. 0 means 1.
	Cost int64
	// Workers is how many goroutines of each instance issue its requests,
	// the requests it can have in flight. 0 means 4.
	Workers int
	// Seed seeds the arrival times and the keys drawn: runs of the same
	// Scenario, whatever their mode, are asked the same requests at the
	// same times.
	Seed uint64
	// Config configures the hybrid Limiters. Run sets Prefix (unique per
	// run) and InstanceID.
	Config hybrid.Config
	// Outage, if its For is not 0, takes the Target's Redis away during
	// each run, At after the first arrival, for For, and brings it back
	// empty. At + For must not exceed Duration.
	Outage Outage
	// Closed, if true, runs a closed loop instead of Poisson arrivals:
	// each worker issues its next request as soon as the last one is
	// answered, for Duration. Demand is ignored; the run measures the most
	// decisions per second the fleet can make, and every key asked for is
	// saturated. Latency is then measured on one decision in 16, so that
	// the bench's clock reads do not weigh on the throughput.
	Closed bool
	// Passes, if not 0, makes the run a long tail, as of per-user limits:
	// a closed loop (Closed is implied) in which every one of the Keys is
	// asked exactly Passes times, and that ends when all of them are
	// asked (or Duration has passed). Each pass asks every key once; a
	// pass's keys are dealt round-robin over all the fleet's workers, a
	// key to a worker of another instance in each pass, and each worker
	// asks its share in an order shuffled from Seed. Keys * Passes is at
	// most 10^8. Demand, Dist and ZipfS are ignored, and an Outage is
	// refused. On a single real Redis the report then carries what the run
	// cost Redis (LongTailReport.Redis).
	Passes int
	// Spread, in a long tail, is how many instances ask each key in each
	// pass, at about the same time: a user's requests spread by a load
	// balancer over several instances within a round. The keys of a pass
	// are then asked in one order, shuffled from Seed, that every
	// instance follows, each worker taking every Workers-th key of its
	// instance's; with Spread equal to Instances every instance asks every
	// key. Keys * Passes * Spread asks in all. 0 or 1: each key is asked
	// by one instance a pass, as Passes says.
	Spread int
	// Warm calls each hybrid Limiter's Warm before requests arrive (the
	// settlement script loaded, a connection open), as a service that
	// warms up before it reports itself ready; the peers start as they
	// are. false: each Limiter's first decisions pay for that.
	Warm bool
}

// Outage is a Redis outage in a run: from At after the first arrival, for
// For. The zero Outage is none.
type Outage struct {
	At, For time.Duration
}

// ParseOutage parses "DUR@AT", such as "2s@5s": down for DUR from AT after
// the first arrival. "" is no outage.
func ParseOutage(s string) (Outage, error) {
	if s == "" {
		return Outage{}, nil
	}
	dur, at, ok := strings.Cut(s, "@")
	if !ok {
		return Outage{}, fmt.Errorf("%w: outage %q, want DUR@AT such as 2s@5s", ErrScenario, s)
	}
	f, err := time.ParseDuration(dur)
	if err != nil {
		return Outage{}, fmt.Errorf("%w: outage %q: %w", ErrScenario, s, err)
	}
	a, err := time.ParseDuration(at)
	if err != nil {
		return Outage{}, fmt.Errorf("%w: outage %q: %w", ErrScenario, s, err)
	}
	if f <= 0 || a < 0 {
		return Outage{}, fmt.Errorf("%w: outage %q, want a positive DUR and AT >= 0", ErrScenario, s)
	}
	return Outage{At: a, For: f}, nil
}

// String returns o as DUR@AT, or "" for none.
func (o Outage) String() string {
	if o.For == 0 {
		return ""
	}
	return o.For.String() + "@" + o.At.String()
}

// withDefaults returns sc with its zero fields set, or an error wrapping
// ErrScenario.
func (sc Scenario) withDefaults() (Scenario, error) {
	if sc.Instances == 0 {
		sc.Instances = 8
	}
	if sc.Duration == 0 {
		sc.Duration = 10 * time.Second
		if sc.Passes > 0 {
			sc.Duration = 10 * time.Minute
		}
	}
	if sc.Keys == 0 {
		sc.Keys = 1
	}
	if sc.Dist == "" {
		sc.Dist = Uniform
	}
	if sc.ZipfS == 0 {
		sc.ZipfS = 1.1
	}
	if sc.Demand == 0 {
		sc.Demand = 4
	}
	if sc.Rate == 0 {
		sc.Rate = 1000
	}
	if sc.Burst == 0 {
		sc.Burst = 1000
	}
	if sc.Cost == 0 {
		sc.Cost = 1
	}
	if sc.Workers == 0 {
		sc.Workers = 4
	}
	if sc.Passes > 0 {
		sc.Closed = true
	}
	switch {
	case sc.Instances < 0, sc.Duration < 0, sc.Keys < 0, sc.Workers < 0:
		return sc, fmt.Errorf("%w: negative count or duration", ErrScenario)
	case sc.Dist != Uniform && sc.Dist != Zipf:
		return sc, fmt.Errorf("%w: distribution %q, want %q or %q", ErrScenario, sc.Dist, Uniform, Zipf)
	case sc.Dist == Zipf && !(sc.ZipfS > 1):
		return sc, fmt.Errorf("%w: Zipf exponent %v, want > 1", ErrScenario, sc.ZipfS)
	case !(sc.Demand > 0) || math.IsInf(sc.Demand, 0):
		return sc, fmt.Errorf("%w: demand %v", ErrScenario, sc.Demand)
	case !(sc.Rate >= 1e-6 && sc.Rate <= 1e9):
		return sc, fmt.Errorf("%w: rate %v, want 1e-6 to 1e9", ErrScenario, sc.Rate)
	case sc.Burst < 1 || sc.Burst > 1e9:
		return sc, fmt.Errorf("%w: burst %d, want 1 to 1e9", ErrScenario, sc.Burst)
	case sc.Cost < 1 || sc.Cost > sc.Burst:
		return sc, fmt.Errorf("%w: cost %d, want 1 to the burst", ErrScenario, sc.Cost)
	case sc.Outage.For < 0 || sc.Outage.At < 0:
		return sc, fmt.Errorf("%w: negative outage %v@%v", ErrScenario, sc.Outage.For, sc.Outage.At)
	case sc.Outage.For > 0 && sc.Outage.At+sc.Outage.For > sc.Duration:
		return sc, fmt.Errorf("%w: outage %v@%v ends after the duration %v", ErrScenario, sc.Outage.For, sc.Outage.At, sc.Duration)
	case sc.Passes < 0:
		return sc, fmt.Errorf("%w: negative passes %d", ErrScenario, sc.Passes)
	case sc.Passes > 0 && sc.Outage.For > 0:
		return sc, fmt.Errorf("%w: an outage in a long tail (passes %d)", ErrScenario, sc.Passes)
	case sc.Spread < 0 || sc.Spread > sc.Instances:
		return sc, fmt.Errorf("%w: spread %d, want 0 to the %d instances", ErrScenario, sc.Spread, sc.Instances)
	case sc.Spread > 1 && sc.Passes == 0:
		return sc, fmt.Errorf("%w: a spread (%d) without a long tail (passes)", ErrScenario, sc.Spread)
	case sc.Passes > 0 && sc.asks() > maxAsks:
		return sc, fmt.Errorf("%w: %d keys x %d passes x %d instances, more than %d asks", ErrScenario, sc.Keys, sc.Passes, sc.spread(), maxAsks)
	}
	return sc, nil
}

// Offered returns the requests per second the fleet asks for:
// Demand * Rate * Keys / Cost, with sc's defaults applied.
func (sc Scenario) Offered() float64 {
	sc, _ = sc.withDefaults()
	return sc.Demand * sc.Rate * float64(sc.Keys) / float64(sc.Cost)
}

// String describes sc in one line, with its defaults applied.
func (sc Scenario) String() string {
	sc, _ = sc.withDefaults()
	if sc.Passes > 0 {
		spread := ""
		if sc.spread() > 1 {
			spread = fmt.Sprintf(" x %d instances at once", sc.spread())
		}
		return fmt.Sprintf("%s x %s, long tail: %s x %s%s (%s, closed loop), R=%g/s B=%d cost %d, at most %v",
			plural.Count(sc.Instances, "instance"), plural.Count(sc.Workers, "worker"), plural.Count(sc.Keys, "key"),
			plural.Count(sc.Passes, "pass"), spread, plural.Count(sc.asks(), "ask"), sc.Rate, sc.Burst, sc.Cost, sc.Duration)
	}
	keys := "1 hot key"
	if sc.Keys > 1 {
		keys = strconv.Itoa(sc.Keys) + " keys " + sc.Dist
		if sc.Dist == Zipf {
			keys += "(" + strconv.FormatFloat(sc.ZipfS, 'g', -1, 64) + ")"
		}
	}
	load := fmt.Sprintf("demand %gx (%.0f req/s)", sc.Demand, sc.Offered())
	if sc.Closed {
		load = "closed loop (as fast as answered)"
	}
	s := fmt.Sprintf("%s x %s, %s, %s, R=%g/s B=%d cost %d, %v",
		plural.Count(sc.Instances, "instance"), plural.Count(sc.Workers, "worker"), keys, load, sc.Rate, sc.Burst, sc.Cost, sc.Duration)
	if sc.Outage.For > 0 {
		s += fmt.Sprintf(", Redis down for %v at %v", sc.Outage.For, sc.Outage.At)
	}
	return s
}

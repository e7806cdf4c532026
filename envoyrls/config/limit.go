package config

import (
	"strconv"
	"strings"
	"time"
)

// Unit is the unit of time of a rate limit. Its values are those of the
// Unit enum of Envoy's RateLimitResponse.RateLimit
// (envoy.service.ratelimit.v3), so a Unit converts to and from it with a
// plain conversion. The zero Unit is UnitUnknown.
type Unit int32

// The units. The numbering is the proto enum's, where week came last.
const (
	// UnitUnknown is no unit: that of an unlimited rate_limit.
	UnitUnknown Unit = 0
	// UnitSecond is a second.
	UnitSecond Unit = 1
	// UnitMinute is a minute.
	UnitMinute Unit = 2
	// UnitHour is an hour.
	UnitHour Unit = 3
	// UnitDay is a day of 24 hours.
	UnitDay Unit = 4
	// UnitMonth is a month of 30 days.
	UnitMonth Unit = 5
	// UnitYear is a year of 365 days.
	UnitYear Unit = 6
	// UnitWeek is a week of 7 days.
	UnitWeek Unit = 7
)

// unitNames are the units' names, as the configuration spells them.
var unitNames = [...]string{
	UnitUnknown: "unknown",
	UnitSecond:  "second",
	UnitMinute:  "minute",
	UnitHour:    "hour",
	UnitDay:     "day",
	UnitMonth:   "month",
	UnitYear:    "year",
	UnitWeek:    "week",
}

// unitDurations are the units' lengths, those of the original's fixed
// windows (a month is 30 days, a year 365).
var unitDurations = [...]time.Duration{
	UnitSecond: time.Second,
	UnitMinute: time.Minute,
	UnitHour:   time.Hour,
	UnitDay:    24 * time.Hour,
	UnitMonth:  30 * 24 * time.Hour,
	UnitYear:   365 * 24 * time.Hour,
	UnitWeek:   7 * 24 * time.Hour,
}

// String returns the unit's name as the configuration spells it: "second",
// "minute", ..., "unknown" for UnitUnknown, and "Unit(n)" for a value
// outside the enum.
func (u Unit) String() string {
	if u >= 0 && int(u) < len(unitNames) {
		return unitNames[u]
	}
	return "Unit(" + strconv.Itoa(int(u)) + ")"
}

// Duration returns the length of the unit: time.Second for UnitSecond, 30
// days for UnitMonth, 365 days for UnitYear. It returns 0 for UnitUnknown
// and for a value outside the enum.
func (u Unit) Duration() time.Duration {
	if u >= 0 && int(u) < len(unitDurations) {
		return unitDurations[u]
	}
	return 0
}

// parseUnit reads a unit as the original does: the name upper-cased (with
// strings.ToUpper, so "Minute" and "MINUTE" are minute too) and looked up
// in the proto enum's names. ok is false for a name that is not there and
// for "unknown", which is there but is no unit.
func parseUnit(name string) (u Unit, ok bool) {
	switch strings.ToUpper(name) {
	case "SECOND":
		return UnitSecond, true
	case "MINUTE":
		return UnitMinute, true
	case "HOUR":
		return UnitHour, true
	case "DAY":
		return UnitDay, true
	case "WEEK":
		return UnitWeek, true
	case "MONTH":
		return UnitMonth, true
	case "YEAR":
		return UnitYear, true
	}
	return UnitUnknown, false
}

// Limit is the rate_limit block of a descriptor.
type Limit struct {
	// RequestsPerUnit is requests_per_unit: the requests allowed in each
	// Unit. 0 denies every request.
	RequestsPerUnit uint32
	// Unit is the unit of time. It is UnitUnknown when Unlimited is set.
	Unit Unit
	// Unlimited is unlimited: every request is allowed without counting.
	// RequestsPerUnit keeps whatever the file gave it.
	Unlimited bool
	// Name is name: what the replaces of other limits refer to. It may be
	// "".
	Name string
	// Replaces is the names listed in replaces, in order, none of them ""
	// or Name. It is shared with the Rules and must not be modified.
	Replaces []string
	// Mode is mode, a field of this package's own (see Mode): how the
	// limit is settled across a fleet. It is ModeDefault when the file
	// names none, and always for an Override.
	Mode Mode
}

// Mode is how a limit is settled across the instances of a fleet: the
// mode field of a rate_limit, which this package adds to the original's
// format (the original rejects a file that uses it, as it rejects any
// field it does not know). Its values name the settlement modes of
// package hybrid. The zero Mode is ModeDefault.
type Mode uint8

// The modes, as the field spells them: lease, optimistic and exact, in
// any case.
const (
	// ModeDefault is no mode field: the server's default applies.
	ModeDefault Mode = iota
	// ModeLease reserves allowance before it is spent (hybrid.Lease).
	ModeLease
	// ModeOptimistic spends first and settles at the next round
	// (hybrid.Optimistic).
	ModeOptimistic
	// ModeExact asks Redis for every decision (hybrid.Exact).
	ModeExact
)

// modeNames are the modes' names, as the configuration spells them.
var modeNames = [...]string{
	ModeDefault:    "default",
	ModeLease:      "lease",
	ModeOptimistic: "optimistic",
	ModeExact:      "exact",
}

// String returns the mode's name as the configuration spells it: "lease",
// "optimistic", "exact", "default" for ModeDefault, and "Mode(n)" for a
// value outside the enum.
func (m Mode) String() string {
	if int(m) < len(modeNames) {
		return modeNames[m]
	}
	return "Mode(" + strconv.Itoa(int(m)) + ")"
}

// parseMode reads the mode field: lease, optimistic or exact, in any case.
// ok is false for anything else, "default" included, which is no value of
// the field.
func parseMode(name string) (m Mode, ok bool) {
	switch strings.ToLower(name) {
	case "lease":
		return ModeLease, true
	case "optimistic":
		return ModeOptimistic, true
	case "exact":
		return ModeExact, true
	}
	return ModeDefault, false
}

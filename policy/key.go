package policy

import (
	"crypto/sha256"
	"encoding/hex"
	"net/http"

	"github.com/hybridlimit/hybrid"
)

// maxValueLen is the longest identity value that goes into a key as it is;
// a longer one is replaced by its SHA-256.
const maxValueLen = 128

// sharedPlan stands for the plan in the keys of shared rules. Plan names
// cannot contain it.
const sharedPlan = "*"

// tierKind is what identifies a rule's bucket.
type tierKind uint8

const (
	tierUser tierKind = iota
	tierAPIKey
	tierIP
	tierHeader
	tierEndpoint
	tierGlobal
)

// rank orders the checks of a request: the narrower the bucket, the earlier
// (see AppendChecks).
func (k tierKind) rank() int8 {
	switch k {
	case tierUser, tierAPIKey, tierIP:
		return 0
	case tierHeader:
		return 1
	case tierEndpoint:
		return 2
	}
	return 3
}

// compiled is a rule made ready for one plan: its check with everything
// that does not depend on the request filled in.
type compiled struct {
	base   hybrid.Check // Key set for the endpoint and global tiers
	kind   tierKind
	rank   int8
	order  int    // the rule's place in its plan
	header string // canonical, for tierHeader
	prefix string // "plan|rule|tier|": the key of a value is prefix+value
	hashed string // "plan|rule|tier#": the key of a long value is hashed+hex(SHA-256)
}

// compile prepares rule r of plan planKey (sharedPlan for a shared rule).
func compile(planKey string, r *Rule, kind tierKind, header string) compiled {
	head := planKey + "|" + r.Name + "|" + r.Tier
	c := compiled{
		base:   hybrid.Check{Tier: r.Name, Limit: r.Limit, Cost: r.Cost},
		kind:   kind,
		rank:   kind.rank(),
		header: header,
		prefix: head + "|",
		hashed: head + "#",
	}
	switch kind {
	case tierEndpoint:
		c.base.Key = c.key(r.Route)
	case tierGlobal:
		c.base.Key = c.prefix
	}
	return c
}

// key returns the key of the bucket of value v.
func (c *compiled) key(v string) string {
	if len(v) <= maxValueLen {
		return c.prefix + v
	}
	sum := sha256.Sum256([]byte(v))
	b := make([]byte, len(c.hashed)+hex.EncodedLen(len(sum)))
	n := copy(b, c.hashed)
	hex.Encode(b[n:], sum[:])
	return string(b)
}

// check returns c's check for a request r from id, and false if id does not
// carry the identity c's tier needs.
func (c *compiled) check(r *http.Request, id *Identity) (hybrid.Check, bool) {
	var v string
	switch c.kind {
	case tierEndpoint, tierGlobal:
		return c.base, true
	case tierUser:
		v = id.User
	case tierAPIKey:
		v = id.APIKey
	case tierIP:
		v = id.IP
	case tierHeader:
		if vs := r.Header[c.header]; len(vs) > 0 {
			v = vs[0]
		}
	}
	if v == "" {
		return hybrid.Check{}, false
	}
	ch := c.base
	ch.Key = c.key(v)
	return ch, true
}

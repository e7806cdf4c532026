package rls

import (
	"sync/atomic"

	"github.com/hybridlimit/hybrid/envoyrls/config"
)

// Rules holds the configuration a Server serves, so that a new one can
// take its place while it serves: Store swaps it atomically, and the
// requests under way finish with the rules they started with. Its Load
// method is what New takes:
//
//	rules := rls.NewRules(loaded)
//	srv, err := rls.New(lim, rules.Load, rls.Config{})
//	...
//	rules.Store(reloaded) // the next request sees it
//
// The zero Rules holds none: a Server answers every request with the
// original's error for a service that has loaded no configuration. Rules is
// safe for concurrent use.
type Rules struct {
	p atomic.Pointer[config.Rules]
}

// NewRules returns a Rules that holds r.
func NewRules(r *config.Rules) *Rules {
	h := new(Rules)
	h.Store(r)
	return h
}

// Load returns the rules held, nil if none. It takes no lock.
func (h *Rules) Load() *config.Rules { return h.p.Load() }

// Store makes r the rules held; nil holds none.
func (h *Rules) Store(r *config.Rules) { h.p.Store(r) }

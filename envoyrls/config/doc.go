// Package config reads the YAML configuration of envoyproxy/ratelimit,
// Envoy's external rate limit service, exactly as that service reads it,
// and finds the limit of a request's descriptor as it does.
//
// A file configures one domain and its tree of descriptors:
//
//	domain: messaging
//	descriptors:
//	  - key: message_type
//	    value: marketing
//	    descriptors:
//	      - key: to_number
//	        rate_limit:
//	          unit: day
//	          requests_per_unit: 5
//	  - key: to_number
//	    rate_limit:
//	      unit: day
//	      requests_per_unit: 100
//
// A descriptor has a key, an optional value, an optional rate_limit
// (unit, requests_per_unit, unlimited, name, replaces: [{name}]), optional
// nested descriptors, and the flags shadow_mode, quota_mode,
// detailed_metric, value_to_metric and share_threshold, and metadata (any
// YAML, returned with the match). The units are second, minute, hour, day,
// week, month (30 days) and year (365 days), in any case. A value, or a
// key, may hold '*' wildcards, each matching any run of bytes. Nothing
// else is accepted, but the mode field of this package's own (below): a
// field name the format does not have is an error.
//
// Load reads files given as bytes, LoadDir the files of a directory and
// LoadFS those of an fs.FS. They return *Rules, which Lookup searches per
// request without allocating:
//
//	rules, err := config.LoadDir("/srv/runtime_data/current/config", config.Options{})
//	...
//	m, ok := rules.Lookup("messaging", []config.Entry{{Key: "to_number", Value: "2061111111"}})
//	if ok && !m.Limit.Unlimited {
//		// m.Limit.RequestsPerUnit per m.Limit.Unit.Duration(), stats under m.StatsKey()
//	}
//
// A rejected configuration is an *Error that names the file, the domain
// and the descriptor path, and wraps one of the Err sentinels.
//
// # The mode field
//
// The package accepts one field the original does not have: mode, in a
// rate_limit, which says how the limit is settled across a fleet by the
// service built on package hybrid (lease, the default, optimistic or
// exact; see Mode):
//
//	domain: messaging
//	descriptors:
//	  - key: to_number
//	    rate_limit:
//	      unit: day
//	      requests_per_unit: 100
//	      mode: optimistic
//
// A file that uses it is this package's only: the original rejects it, as
// it rejects every field it does not know. mode is known in a rate_limit
// alone; anywhere else it is ErrMode, as is a value other than lease,
// optimistic and exact (in any case). Every file the original accepts
// loads here as there, with Limit.Mode ModeDefault.
//
// # Fidelity
//
// The package decodes with the YAML library the original uses,
// gopkg.in/yaml.v2, in the same two passes (into a generic map, whose
// field names and values are checked, then into the typed shape), so the
// same documents parse and the same are rejected, with the same quirks: a
// known field name in the wrong place is accepted and ignored; unlimited
// with requests_per_unit, or with an invalid unit, is accepted (only a
// valid unit is rejected); replaces may name a limit that does not exist;
// a float anywhere but in metadata is rejected. Descriptors are keyed by
// their composite key, "key_value" or "key", as in the original: key "a"
// with value "b_c" and key "a_b" with value "c" are duplicates, and the
// request entry ("a_b", "c") matches either. Where the original's README
// and its code disagree, this package follows the code and its tests:
// wildcards may stand anywhere in a value, not only at its end, and with
// share_threshold the stats key shows the whole pattern ("route_api/*"),
// not the part before the '*'.
//
// It differs from the original in these ways:
//
//   - When a file has several problems, the original reports one of them
//     at random (it walks Go maps); this package always reports the same
//     one. Files are loaded in the order given, and LoadDir's in lexical
//     order, where the original's runtime gives them in random order:
//     which of two files with one domain is named in ErrDuplicateDomain
//     then differs.
//   - Messages differ: they name the domain and the descriptor path and
//     say what is wrong in words of their own. The original names a file
//     of its directory by its path with dots for slashes
//     ("config.limits.yaml"); this package keeps the slashes.
//   - LoadDir fails on a file it cannot read, where the original logs it
//     and loads the rest; it skips links to directories, which the
//     original cannot read either.
//   - The original's stats (counters per key, domain_not_found) are not
//     kept here: Match.StatsKey gives their key, HasDomain says whether a
//     domain is known.
package config

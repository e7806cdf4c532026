package config_test

import (
	"fmt"

	"github.com/hybridlimit/hybrid/envoyrls/config"
)

func Example() {
	rules, err := config.Load([]config.File{{Name: "messaging.yaml", Data: []byte(`
domain: messaging
descriptors:
  - key: message_type
    value: marketing
    descriptors:
      - key: to_number
        rate_limit:
          unit: day
          requests_per_unit: 5
  - key: to_number
    detailed_metric: true
    rate_limit:
      unit: day
      requests_per_unit: 100
`)}}, config.Options{})
	if err != nil {
		panic(err)
	}
	// One request may carry several descriptors; each is looked up alone.
	for _, entries := range [][]config.Entry{
		{{Key: "message_type", Value: "marketing"}, {Key: "to_number", Value: "2061111111"}},
		{{Key: "to_number", Value: "2061111111"}},
		{{Key: "message_type", Value: "marketing"}},
	} {
		m, ok := rules.Lookup("messaging", entries)
		if !ok {
			fmt.Printf("%v: no limit\n", entries)
			continue
		}
		fmt.Printf("%s: %d per %v, stats %s\n", m.Path, m.Limit.RequestsPerUnit, m.Limit.Unit.Duration(), m.StatsKey())
	}
	// Output:
	// message_type_marketing.to_number: 5 per 24h0m0s, stats messaging.message_type_marketing.to_number
	// to_number: 100 per 24h0m0s, stats messaging.to_number_2061111111
	// [{message_type marketing}]: no limit
}

func ExampleLoad_error() {
	_, err := config.Load([]config.File{{Name: "limits.yaml", Data: []byte(`
domain: mongo_cps
descriptors:
  - key: database
    value: users
    rate_limit: {unit: second, requests_per_unit: 500}
  - key: database
    value: users
    rate_limit: {unit: second, requests_per_unit: 50}
`)}}, config.Options{})
	fmt.Println(err)
	// Output:
	// config: limits.yaml: domain "mongo_cps": descriptor "database_users": duplicate key
}

func ExampleMatch_ReplacedBy() {
	rules, err := config.Load([]config.File{{Name: "example7.yaml", Data: []byte(`
domain: example7
descriptors:
  - key: key_1
    value: value_1
    descriptors:
      - key: user
        value: bkthomps
        rate_limit: {name: specific_limit, unit: second, requests_per_unit: 5}
  - key: key_2
    value: value_2
    descriptors:
      - key: user
        value: bkthomps
        rate_limit:
          replaces: [{name: specific_limit}]
          unit: second
          requests_per_unit: 10
`)}}, config.Options{})
	if err != nil {
		panic(err)
	}
	// A request with both descriptors: the second limit replaces the first.
	var matches []config.Match
	for _, entries := range [][]config.Entry{
		{{Key: "key_1", Value: "value_1"}, {Key: "user", Value: "bkthomps"}},
		{{Key: "key_2", Value: "value_2"}, {Key: "user", Value: "bkthomps"}},
	} {
		m, _ := rules.Lookup("example7", entries)
		matches = append(matches, m)
	}
	for i := range matches {
		fmt.Printf("%s: %d/s, replaced %v\n", matches[i].Path, matches[i].Limit.RequestsPerUnit, matches[i].ReplacedBy(matches))
	}
	// Output:
	// key_1_value_1.user_bkthomps: 5/s, replaced true
	// key_2_value_2.user_bkthomps: 10/s, replaced false
}

package bench

import (
	"testing"
	"time"
)

// TestAccuracySaturated: only keys asked for at least B + R*T count against
// it, in a closed loop too: a Zipf tail asked for a token or two, and
// admitted all of it, is not under-admission (it read as 33% for exact mode
// when every key asked for counted).
func TestAccuracySaturated(t *testing.T) {
	for _, closed := range []bool{false, true} {
		r := &run{sc: Scenario{Rate: 1, Burst: 10, Cost: 1, Closed: closed}, keys: []string{"hot", "warm", "tail1", "tail2"}}
		rep := &Report{Window: 10 * time.Second} // ideal 20 a key
		r.accuracy(rep, []int64{1000, 20, 2, 1}, []int64{19, 18, 2, 1})
		if rep.SaturatedKeys != 2 || rep.IdealSaturated != 40 || rep.AdmittedSaturated != 37 || rep.AdmittedPct != 92.5 {
			t.Errorf("closed %v: saturated %d, ideal %v, admitted %d (%.1f%%); want the 2 keys asked for 20 or more: ideal 40, admitted 37 (92.5%%)",
				closed, rep.SaturatedKeys, rep.IdealSaturated, rep.AdmittedSaturated, rep.AdmittedPct)
		}
	}
}

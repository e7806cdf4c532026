package global

import (
	"reflect"
	"testing"
	"time"
)

// TestBoxes: a call's arguments boxed through boxes are the arguments each
// settlement boxes on its own, and the keys of a batch that share their
// limit, want and instance cost no allocation a key for them (they were
// three to four a key, half of a cold decision's allocations).
func TestBoxes(t *testing.T) {
	batch := make([]Settlement, 100)
	for i := range batch {
		batch[i] = Settlement{
			Key:      "k",
			Limit:    MicroLimit{Rate: 166_667, Burst: 20_000_000},
			Consumed: int64(i%3) * 1_000_000,
			Want:     2_000_000,
			MinGrant: 1_000_000,
			Instance: "host-1",
			Seq:      int64(i % 7), // 0 on some: no seq
		}
	}
	batch[50].Since = time.UnixMicro(1_700_000_000_000_000)
	batch[50].Seq, batch[50].Claim = 9, 0
	for _, stride := range []int{10, 12} {
		var want []any
		for i := range batch {
			want = batch[i].appendArgsN(want, stride)
		}
		var bx boxes
		var got []any
		for i := range batch {
			got = batch[i].appendBoxed(got, stride, &bx)
		}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("stride %d: boxed through boxes %v, want %v", stride, got, want)
		}
	}

	same := batch[:0:0]
	for i := range 100 {
		same = append(same, Settlement{Key: "k", Limit: MicroLimit{Rate: 166_667, Burst: 20_000_000},
			Want: 2_000_000, MinGrant: 2_000_000, Instance: "host-1", Seq: 1 + int64(i%100)})
	}
	args := make([]any, 0, 10*len(same))
	allocs := testing.AllocsPerRun(20, func() {
		var bx boxes
		a := args[:0]
		for i := range same {
			a = same[i].appendBoxed(a, 10, &bx)
		}
	})
	// Rate, burst (and debt, the same), want (and min grant) and the
	// instance, once each a call; the seqs are below 256.
	if allocs > 4 {
		t.Errorf("100 settlements of one limit: %v allocations, want 4 at most", allocs)
	}

	// More distinct values than boxes holds still box right.
	var bx boxes
	for v := int64(1000); v < 1020; v++ {
		if got := bx.box(v); got != any(v) {
			t.Errorf("box(%d) = %v", v, got)
		}
		if got := bx.box(v - 3); got != any(v-3) {
			t.Errorf("box(%d) = %v", v-3, got)
		}
	}
	for _, id := range []string{"a", "b", "a", "a"} {
		if got := bx.instance(id); got != any(id) {
			t.Errorf("instance(%q) = %v", id, got)
		}
	}
}

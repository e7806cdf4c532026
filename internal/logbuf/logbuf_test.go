package logbuf

import (
	"strings"
	"sync"
	"testing"
)

// TestBuffer writes from 8 goroutines while String reads: every line is
// there once, whole (the race detector checks the rest).
func TestBuffer(t *testing.T) {
	var b Buffer
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 100 {
				b.Write([]byte("line\n"))
				_ = b.String()
			}
		})
	}
	wg.Wait()
	if got := strings.Count(b.String(), "line\n"); got != 800 {
		t.Errorf("%d lines written, want 800", got)
	}
}

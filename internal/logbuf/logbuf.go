// Package logbuf holds a buffer that a log, a process's output or a
// server's log lines may be written to while a test reads it.
package logbuf

import (
	"bytes"
	"sync"
)

// Buffer is a bytes.Buffer safe for concurrent use: writes from any
// goroutine, String from the test. The zero Buffer is empty and ready to
// use.
type Buffer struct {
	mu sync.Mutex // protects b
	b  bytes.Buffer
}

// Write appends p.
func (s *Buffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

// String returns what was written so far.
func (s *Buffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

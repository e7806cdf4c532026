package redistest

import "testing"

func TestCheckLoopback(t *testing.T) {
	tests := []struct {
		addr string
		ok   bool
	}{
		{"127.0.0.1:6379", true},
		{"127.0.0.2:6379", true},
		{"[::1]:6379", true},
		{"localhost:6379", true},
		{"10.0.0.1:6379", false},
		{"192.168.1.5:6379", false},
		{"redis:6379", false},
		{"example.com:6379", false},
		{"[::]:6379", false},
		{"0.0.0.0:6379", false},
		{"127.0.0.1", false},
		{"127.0.0.1:http", false},
		{"6379", false},
		{"", false},
	}
	for _, tt := range tests {
		err := CheckLoopback(tt.addr)
		if (err == nil) != tt.ok {
			t.Errorf("CheckLoopback(%q) = %v, want ok %v", tt.addr, err, tt.ok)
		}
	}
}

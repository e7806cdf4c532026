package grpclimit_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/hybridlimit/hybrid"
	"github.com/hybridlimit/hybrid/grpclimit"
	"github.com/hybridlimit/hybrid/httplimit"
)

// TestErrors: a call that cannot be decided is answered with the status of
// ErrorStatus, whose message never shows the error's text, counted, and
// not served; no metadata is sent.
func TestErrors(t *testing.T) {
	lm := hybrid.Limit{Rate: slow, Burst: 2}
	secret := errors.New("secret-internal-detail")
	checks := func(cs []hybrid.Check, err error) func(context.Context, string) ([]hybrid.Check, error) {
		return func(context.Context, string) ([]hybrid.Check, error) { return cs, err }
	}
	tests := []struct {
		name string
		cfg  grpclimit.Config
		code codes.Code
	}{
		{"no metadata key", grpclimit.Config{Key: grpclimit.ByMetadata("x-api-key"), Limit: lm}, codes.InvalidArgument},
		{"empty key", grpclimit.Config{Key: func(context.Context, string) (string, error) { return "", nil }, Limit: lm}, codes.InvalidArgument},
		{"KeyFunc fails", grpclimit.Config{Key: func(context.Context, string) (string, error) { return "", secret }, Limit: lm}, codes.Internal},
		{"cost above the burst", grpclimit.Config{Limit: lm, Cost: func(context.Context, string) int64 { return 3 }}, codes.InvalidArgument},
		{"negative cost", grpclimit.Config{Limit: lm, Cost: func(context.Context, string) int64 { return -1 }}, codes.InvalidArgument},
		{"Checks fails", grpclimit.Config{Checks: checks(nil, secret)}, codes.Internal},
		{"Checks finds no key", grpclimit.Config{Checks: checks(nil, fmt.Errorf("no user: %w", grpclimit.ErrNoKey))}, codes.InvalidArgument},
		{"Checks finds no key (httplimit)", grpclimit.Config{Checks: checks(nil, httplimit.ErrNoKey)}, codes.InvalidArgument},
		{"Checks gives an empty key", grpclimit.Config{Checks: checks([]hybrid.Check{{Limit: lm}}, nil)}, codes.InvalidArgument},
		{"Checks gives an invalid limit", grpclimit.Config{Checks: checks([]hybrid.Check{{Key: "secret-key", Limit: hybrid.Limit{Rate: -1, Burst: 1}}}, nil)}, codes.Internal},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			inBubble(t, func(t *testing.T, lim *hybrid.Limiter) {
				ic := newInterceptor(t, lim, tt.cfg)
				s := serve(t, ic, options{})
				header, _, err := s.check(context.Background())
				if status.Code(err) != tt.code {
					t.Fatalf("Check: %v, want %v", err, tt.code)
				}
				if msg := status.Convert(err).Message(); strings.Contains(msg, "secret") {
					t.Errorf("the message %q shows the error", msg)
				}
				if len(header.Get("ratelimit")) != 0 {
					t.Errorf("header %v on an error", header)
				}
				if _, err := s.watch(t); status.Code(err) != tt.code {
					t.Errorf("Watch: %v, want %v", err, tt.code)
				}
				if got, want := ic.Stats(), (grpclimit.Stats{Errors: 2}); got != want {
					t.Errorf("Stats() = %+v, want %+v", got, want)
				}
				if got := s.served.Load(); got != 0 {
					t.Errorf("the handler ran %d times, want 0", got)
				}
			})
		})
	}
}

// TestClosed: a closed Limiter answers Unavailable.
func TestClosed(t *testing.T) {
	inBubble(t, func(t *testing.T, lim *hybrid.Limiter) {
		ic := newInterceptor(t, lim, grpclimit.Config{Limit: hybrid.Limit{Rate: slow, Burst: 2}})
		s := serve(t, ic, options{})
		lim.Close(context.Background())
		if _, _, err := s.check(context.Background()); status.Code(err) != codes.Unavailable {
			t.Errorf("Check: %v, want Unavailable", err)
		}
	})
}

// TestErrorStatus: the code of each kind of error, wrapped or not.
func TestErrorStatus(t *testing.T) {
	tests := []struct {
		err  error
		code codes.Code
	}{
		{grpclimit.ErrNoKey, codes.InvalidArgument},
		{fmt.Errorf("grpclimit: tier %q: %w", "x", grpclimit.ErrNoKey), codes.InvalidArgument},
		{httplimit.ErrNoKey, codes.InvalidArgument},
		{hybrid.ErrInvalidKey, codes.InvalidArgument},
		{fmt.Errorf("hybrid: %w", hybrid.ErrInvalidCost), codes.InvalidArgument},
		{hybrid.ErrClosed, codes.Unavailable},
		{context.Canceled, codes.Canceled},
		{fmt.Errorf("x: %w", context.DeadlineExceeded), codes.DeadlineExceeded},
		{hybrid.ErrInvalidLimit, codes.Internal},
		{errors.New("anything"), codes.Internal},
	}
	for _, tt := range tests {
		st := grpclimit.ErrorStatus(tt.err)
		if st.Code() != tt.code || st.Message() == "" || strings.Contains(st.Message(), tt.err.Error()) {
			t.Errorf("ErrorStatus(%v) = %v %q, want %v with a message of its own", tt.err, st.Code(), st.Message(), tt.code)
		}
	}
}

// TestNew: what New refuses.
func TestNew(t *testing.T) {
	m := newLimiter(t)
	lm := hybrid.Limit{Rate: 1, Burst: 1}
	checks := func(context.Context, string) ([]hybrid.Check, error) { return nil, nil }
	tests := []struct {
		name string
		lim  *hybrid.Limiter
		cfg  grpclimit.Config
		ok   bool
	}{
		{"zero Config: invalid limit", m, grpclimit.Config{}, false},
		{"single tier", m, grpclimit.Config{Limit: lm}, true},
		{"Checks", m, grpclimit.Config{Checks: checks}, true},
		{"nil Limiter", nil, grpclimit.Config{Limit: lm}, false},
		{"Checks and Limit", m, grpclimit.Config{Checks: checks, Limit: lm}, false},
		{"Checks and Name", m, grpclimit.Config{Checks: checks, Name: "x"}, false},
		{"Checks and Key", m, grpclimit.Config{Checks: checks, Key: grpclimit.ByMethod()}, false},
		{"Checks and Cost", m, grpclimit.Config{Checks: checks, Cost: func(context.Context, string) int64 { return 1 }}, false},
		{"burst 0", m, grpclimit.Config{Limit: hybrid.Limit{Rate: 1}}, false},
		{"Name not ASCII", m, grpclimit.Config{Name: "café", Limit: lm}, false},
		{"Name with a newline", m, grpclimit.Config{Name: "a\nb", Limit: lm}, false},
	}
	for _, tt := range tests {
		ic, err := grpclimit.New(tt.lim, tt.cfg)
		if (err == nil) != tt.ok || (ic != nil) != tt.ok {
			t.Errorf("%s: New = %v, %v; want ok %v", tt.name, ic, err, tt.ok)
		}
		if err != nil && !strings.HasPrefix(err.Error(), "grpclimit: ") {
			t.Errorf("%s: error %q does not start with grpclimit: ", tt.name, err)
		}
	}
}

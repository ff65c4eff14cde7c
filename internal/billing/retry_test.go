package billing_test

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"example.com/billing/internal/billing"
	"example.com/billing/internal/payment"
)

func TestRetryFor(t *testing.T) {
	for _, tc := range []struct {
		name string
		err  error
		want billing.Retry
	}{
		{"provider 429 with Retry-After", fmt.Errorf("charge: %w", &payment.TransientError{Err: errors.New("429"), RetryAfter: 3 * time.Second}), billing.Retry{Cause: "payment", After: 3 * time.Second}},
		{"provider 503", &payment.TransientError{Err: errors.New("503")}, billing.Retry{Cause: "payment"}},
		{"database", errors.New("claim: connection refused"), billing.Retry{Cause: "database"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := billing.RetryFor(tc.err); got != tc.want {
				t.Errorf("RetryFor(%v) = %+v, want %+v", tc.err, got, tc.want)
			}
		})
	}
}

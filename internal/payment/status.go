package payment

import (
	"errors"
	"fmt"
	"net/http"
)

// TransientStatus is the *TransientError of a provider's answer to ask
// again later, its metric label named by the HTTP status: 409 conflict
// (the key's first request still in flight), 429 rate_limited (with the
// answer's Retry-After), 401 unauthorized and 403 forbidden (the
// environment's fault, never the event's: the partition waits until an
// operator fixes the credentials; forbidden says what the key lacks), 5xx
// server_error, anything else client_error.
func TransientStatus(status int, h http.Header, detail, forbidden string) *TransientError {
	switch {
	case status == http.StatusConflict:
		return Transient("conflict", 0, errors.New(detail))
	case status == http.StatusTooManyRequests:
		return Transient("rate_limited", RetryAfter(h), errors.New(detail))
	case status == http.StatusUnauthorized:
		return Transient("unauthorized", 0, fmt.Errorf("%s (check PAYMENT_API_KEY)", detail))
	case status == http.StatusForbidden:
		return Transient("forbidden", 0, fmt.Errorf("%s (%s)", detail, forbidden))
	case status >= 500:
		return Transient("server_error", RetryAfter(h), errors.New(detail))
	}
	return Transient("client_error", 0, fmt.Errorf("unexpected answer %s", detail))
}

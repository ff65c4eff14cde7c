package main

import (
	"encoding/json"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"example.com/billing/internal/dev/fakepsp"
)

var pspURLLine = regexp.MustCompile(`fakepsp listening on (http://127\.0\.0\.1:\d+)`)

// postCharge posts one charge request and returns the status, 0 when the
// connection failed.
func postCharge(t *testing.T, base, apiKey string, orderID int, key string) int {
	t.Helper()
	body := `{"orderId":` + strconv.Itoa(orderID) + `,"customerId":7,"amount":1999,"currency":"EUR"}`
	req, err := http.NewRequest(http.MethodPost, base+"/v1/charges", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", key)
	if apiKey != "" {
		req.Header.Set("Authorization", "Bearer "+apiKey)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0
	}
	resp.Body.Close()
	return resp.StatusCode
}

func pspStats(t *testing.T, base string) fakepsp.Stats {
	t.Helper()
	code, body := get(strings.TrimPrefix(base, "http://"), "/_stats")
	if code != http.StatusOK {
		t.Fatalf("GET /_stats: %d %s", code, body)
	}
	var st fakepsp.Stats
	if err := json.Unmarshal([]byte(body), &st); err != nil {
		t.Fatal(err)
	}
	return st
}

func TestFakepsp_ServesWithTheFaultsOfItsFlags(t *testing.T) {
	tests := []struct {
		name  string
		flags []string
		env   map[string]string
		check func(t *testing.T, base string)
	}{
		{"DeclineEveryAnswers402", []string{"--decline-every", "7"}, nil, func(t *testing.T, base string) {
			if got := postCharge(t, base, "", 14, "k-14"); got != http.StatusPaymentRequired {
				t.Errorf("order 14 with --decline-every 7: %d, want 402", got)
			}
			if got := postCharge(t, base, "", 15, "k-15"); got != http.StatusOK {
				t.Errorf("order 15 with --decline-every 7: %d, want 200", got)
			}
		}},
		{"FailRate1Answers503", []string{"--fail-rate", "1"}, nil, func(t *testing.T, base string) {
			if got := postCharge(t, base, "", 1, "k-1"); got != http.StatusServiceUnavailable {
				t.Errorf("--fail-rate 1: %d, want 503", got)
			}
			if st := pspStats(t, base); st.InjectedFailures != 1 || st.ChargesCreated != 0 {
				t.Errorf("stats %+v: want one injected failure, no charge", st)
			}
		}},
		{"LatencyDelaysTheAnswer", []string{"--latency", "150ms"}, nil, func(t *testing.T, base string) {
			start := time.Now()
			if got := postCharge(t, base, "", 1, "k-1"); got != http.StatusOK {
				t.Errorf("status %d, want 200", got)
			}
			if took := time.Since(start); took < 150*time.Millisecond {
				t.Errorf("answered in %s with --latency 150ms", took)
			}
		}},
		{"ResetRate1ChargesAndDropsTheAnswer", []string{"--reset-rate", "1", "--seed", "3"}, nil, func(t *testing.T, base string) {
			// Go's transport may resend the request on a reset reused
			// connection and get the stored answer replayed; either way the
			// provider charged once and reset the first answer.
			postCharge(t, base, "", 1, "k-1")
			if st := pspStats(t, base); st.Resets != 1 || st.ChargesCreated != 1 {
				t.Errorf("stats %+v: want one charge whose answer was reset", st)
			}
		}},
		{"APIKeyFromTheEnvironment", nil, map[string]string{"PAYMENT_API_KEY": "sk_test_env"}, func(t *testing.T, base string) {
			if got := postCharge(t, base, "", 1, "k-1"); got != http.StatusUnauthorized {
				t.Errorf("without the key: %d, want 401", got)
			}
			if got := postCharge(t, base, "sk_test_env", 1, "k-1"); got != http.StatusOK {
				t.Errorf("with the key: %d, want 200", got)
			}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := startCommand(t, tt.env, append([]string{"fakepsp", "--addr", "127.0.0.1:0"}, tt.flags...)...)
			base := c.waitOutput(t, pspURLLine, 10*time.Second)
			tt.check(t, base)
			if err := c.stop(t); err != nil {
				t.Fatalf("fakepsp exited with %v", err)
			}
			if code, _ := get(strings.TrimPrefix(base, "http://"), "/healthz"); code != 0 {
				t.Errorf("fakepsp still answers (%d) after it stopped", code)
			}
		})
	}
}

func TestFakepsp_RejectsBadFlags(t *testing.T) {
	for _, args := range [][]string{
		{"--fail-rate", "2"},
		{"--reset-rate", "-0.5"},
		{"--latency", "-1s"},
		{"--decline-every", "-3"},
		{"--api-key", "sk"}, // never a flag: it would show in ps
		{"--addr", "not an address"},
		{"positional"},
	} {
		err := run(t.Context(), append([]string{"billing", "fakepsp"}, args...), nil, nil, &syncBuffer{}, &syncBuffer{})
		if err == nil {
			t.Errorf("fakepsp %v succeeded", args)
		}
	}
	var help syncBuffer
	if err := run(t.Context(), []string{"billing", "fakepsp", "-h"}, nil, nil, &help, &help); err != nil {
		t.Fatalf("fakepsp -h: %v", err)
	}
	for _, want := range []string{"PAYMENT_API_KEY", "-latency", "-fail-rate", "-reset-rate", "-decline-every", "-seed", "-addr"} {
		if !strings.Contains(help.String(), want) {
			t.Errorf("help lacks %q", want)
		}
	}
}

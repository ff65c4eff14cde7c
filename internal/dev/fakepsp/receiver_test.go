package fakepsp_test

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

const webhookSecret = "whsec_test_secret"

// notice is one POST a webhook receiver got.
type notice struct {
	header http.Header
	body   []byte
}

// receiver is a webhook endpoint that records what it gets and answers
// with the status answer chooses (n counts the POSTs, from 0).
type receiver struct {
	URL    string
	answer func(n int, got notice) int

	mu  sync.Mutex
	got []notice
}

// newReceiver serves a webhook endpoint until the test ends; a nil answer
// accepts everything.
func newReceiver(t *testing.T, answer func(n int, got notice) int) *receiver {
	t.Helper()
	if answer == nil {
		answer = func(int, notice) int { return http.StatusOK }
	}
	rc := &receiver{answer: answer}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		if err != nil {
			w.WriteHeader(http.StatusBadRequest)
			return
		}
		got := notice{header: r.Header.Clone(), body: body}
		rc.mu.Lock()
		n := len(rc.got)
		rc.got = append(rc.got, got)
		rc.mu.Unlock()
		w.WriteHeader(rc.answer(n, got))
	}))
	t.Cleanup(srv.Close)
	rc.URL = srv.URL
	return rc
}

// notices returns what the receiver got so far.
func (rc *receiver) notices() []notice {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return append([]notice(nil), rc.got...)
}

// verifyContract checks a contract notification's Signature header as a
// receiver would, with its own HMAC: a v1 that matches one of secrets, a
// timestamp within tolerance of now.
func verifyContract(got notice, tolerance time.Duration, secrets ...string) bool {
	return verifySignature(got.header.Get("Signature"), got.body, tolerance, secrets...)
}

func verifySignature(header string, body []byte, tolerance time.Duration, secrets ...string) bool {
	var ts string
	var sigs []string
	for part := range strings.SplitSeq(header, ",") {
		k, v, _ := strings.Cut(part, "=")
		switch k {
		case "t":
			ts = v
		case "v1":
			sigs = append(sigs, v)
		}
	}
	unix, err := strconv.ParseInt(ts, 10, 64)
	if err != nil || time.Since(time.Unix(unix, 0)).Abs() > tolerance {
		return false
	}
	for _, secret := range secrets {
		mac := hmac.New(sha256.New, []byte(secret))
		mac.Write([]byte(ts + "." + string(body)))
		want := hex.EncodeToString(mac.Sum(nil))
		for _, sig := range sigs {
			if hmac.Equal([]byte(sig), []byte(want)) {
				return true
			}
		}
	}
	return false
}

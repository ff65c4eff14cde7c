package stripe_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"example.com/billing/internal/dev/freeport"
	"example.com/billing/internal/payment"
	"example.com/billing/internal/testenv/wait"
)

// TestShape_StripeMock sends billing's real requests (charge, retrieve,
// search, list and reconciliation's list, each list to its second page)
// through a payment.Client to stripe-mock, Stripe's own server of its API's
// shape: every request must be answered 2xx (stripe-mock validates the
// path, every parameter, the form encoding, the key and, with
// -strict-version-check, the pinned Stripe-Version) and its answer decode.
// stripe-mock reproduces no behaviour (no declines, no idempotency): that
// is the other tests' business.
func TestShape_StripeMock(t *testing.T) {
	base := startStripeMock(t, findStripeMock(t))
	rec := &recorder{}
	front := httptest.NewServer(rec.proxy(t, base))
	t.Cleanup(front.Close)
	c, _ := newClient(t, front.URL)
	ctx := context.Background()

	// stripe-mock takes the key's shape, not its value.
	r := charge
	r.CustomerRef, r.PaymentMethodRef = "cus_123", "pm_card_visa"
	out, err := c.Charge(ctx, r)
	if err != nil {
		t.Fatalf("charge: %v", err)
	}
	if out.Ref == "" {
		t.Errorf("charge: %+v has no PaymentIntent id", out)
	}
	t.Logf("charge: %s %s", out.Kind, out.Ref)

	got, err := c.Resolve(ctx, payment.Lookup{Request: r, Ref: out.Ref, Created: time.Now()})
	if err != nil {
		t.Fatalf("retrieve: %v", err)
	}
	t.Logf("retrieve: %s %s", got.Kind, got.Ref)

	// stripe-mock's PaymentIntents carry no metadata: nothing is found,
	// after the search and both pages of the list.
	got, err = c.Resolve(ctx, payment.Lookup{Request: r, Created: time.Now()})
	if err != nil {
		t.Fatalf("search and list: %v", err)
	}
	t.Logf("search and list: %s", got.Kind)

	to := time.Now().Truncate(time.Hour)
	listed, err := c.Charges(ctx, to.Add(-24*time.Hour), to)
	if err != nil {
		t.Fatalf("reconciliation's list: %v", err)
	}
	if len(listed) == 0 || listed[0].ID == "" || listed[0].Currency != strings.ToUpper(listed[0].Currency) {
		t.Errorf("reconciliation's list: %+v", listed)
	}

	ex := rec.exchanges()
	wantPaths := []string{
		"POST /v1/payment_intents",
		"GET /v1/payment_intents/" + out.Ref,
		"GET /v1/payment_intents/search",
		"GET /v1/payment_intents", "GET /v1/payment_intents", // by customer, two pages
		"GET /v1/payment_intents", "GET /v1/payment_intents", // reconciliation, two pages
	}
	if len(ex) != len(wantPaths) {
		t.Errorf("%d requests, want %d", len(ex), len(wantPaths))
	}
	for i, e := range ex {
		t.Logf("%s %s -> %d", e.request, e.query, e.status)
		if i < len(wantPaths) && e.request != wantPaths[i] {
			t.Errorf("request %d is %s, want %s", i, e.request, wantPaths[i])
		}
		if e.status < 200 || e.status > 299 {
			t.Errorf("%s?%s answered %d: %s", e.request, e.query, e.status, e.body)
		}
	}
	for _, i := range []int{4, 6} {
		if i < len(ex) && !strings.Contains(ex[i].query, "starting_after=") {
			t.Errorf("request %d (%s) is no second page", i, ex[i].query)
		}
	}
}

// exchange is one request through the recorder and its answer.
type exchange struct {
	request string // method and path
	query   string // decoded
	status  int
	body    string // of an answer other than 2xx
}

// recorder stands between billing and stripe-mock and records every
// exchange. stripe-mock answers every list in one page, so it says of the
// first page of each list that more follow: billing's next request, with
// starting_after, is then validated too.
type recorder struct {
	mu  sync.Mutex
	log []exchange
}

func (rec *recorder) proxy(t *testing.T, base string) http.Handler {
	t.Helper()
	target, err := url.Parse(base)
	if err != nil {
		t.Fatal(err)
	}
	p := &httputil.ReverseProxy{Rewrite: func(r *httputil.ProxyRequest) {
		r.SetURL(target)
		// Without billing's Accept-Encoding the proxy's transport asks for
		// gzip itself and hands ModifyResponse the answer decompressed.
		r.Out.Header.Del("Accept-Encoding")
	}}
	p.ModifyResponse = func(resp *http.Response) error {
		req := resp.Request
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			return fmt.Errorf("read stripe-mock's answer: %w", err)
		}
		q, _ := url.QueryUnescape(req.URL.RawQuery)
		e := exchange{request: req.Method + " " + req.URL.Path, query: q, status: resp.StatusCode}
		if resp.StatusCode/100 != 2 {
			e.body = string(body)
		}
		rec.mu.Lock()
		rec.log = append(rec.log, e)
		rec.mu.Unlock()
		if req.Method == http.MethodGet && req.URL.Path == "/v1/payment_intents" && req.URL.Query().Get("starting_after") == "" {
			var list map[string]json.RawMessage
			if err := json.Unmarshal(body, &list); err != nil {
				return fmt.Errorf("stripe-mock's list: %w", err)
			}
			list["has_more"] = json.RawMessage("true")
			if body, err = json.Marshal(list); err != nil {
				return err
			}
		}
		resp.Body = io.NopCloser(bytes.NewReader(body))
		resp.ContentLength = int64(len(body))
		resp.Header.Set("Content-Length", strconv.Itoa(len(body)))
		return nil
	}
	return p
}

func (rec *recorder) exchanges() []exchange {
	rec.mu.Lock()
	defer rec.mu.Unlock()
	return append([]exchange(nil), rec.log...)
}

// findStripeMock returns the stripe-mock on PATH, else in $(go env
// GOPATH)/bin, where `make stripe-mock` installs it. Without one the test
// is skipped, except under CI=true, where it fails: CI must not pass
// without the shape test.
func findStripeMock(t *testing.T) string {
	t.Helper()
	if p, err := exec.LookPath("stripe-mock"); err == nil {
		return p
	}
	if out, err := exec.Command("go", "env", "GOPATH").Output(); err == nil {
		for _, dir := range filepath.SplitList(strings.TrimSpace(string(out))) {
			p := filepath.Join(dir, "bin", "stripe-mock")
			if _, err := os.Stat(p); err == nil {
				return p
			}
		}
	}
	const missing = "stripe-mock is neither on PATH nor in $(go env GOPATH)/bin: `make stripe-mock` installs it"
	if os.Getenv("CI") == "true" {
		t.Fatal(missing)
	}
	t.Skip(missing)
	return ""
}

// startStripeMock starts stripe-mock on free loopback ports (its HTTPS
// listener too, which would otherwise listen on every interface), with
// -strict-version-check, and returns its HTTP address. It is killed when
// the test ends, and dies with the test process.
func startStripeMock(t *testing.T, bin string) string {
	t.Helper()
	ports, err := freeport.Ports(2)
	if err != nil {
		t.Fatal(err)
	}
	addr := fmt.Sprintf("127.0.0.1:%d", ports[0])
	logPath := filepath.Join(t.TempDir(), "stripe-mock.log")
	logFile, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "-http-addr", addr, "-https-addr", fmt.Sprintf("127.0.0.1:%d", ports[1]), "-strict-version-check")
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	exited := make(chan struct{})
	started := make(chan error, 1)
	go func() {
		// Linux sends the death signal when the thread that started the
		// child exits, not the process: this goroutine keeps its thread
		// until the child is gone.
		runtime.LockOSThread()
		defer close(exited)
		if err := cmd.Start(); err != nil {
			started <- err
			return
		}
		started <- nil
		_ = cmd.Wait()
	}()
	if err := <-started; err != nil {
		logFile.Close()
		t.Fatalf("start %s: %v", bin, err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-exited
		logFile.Close()
		if t.Failed() {
			b, _ := os.ReadFile(logPath)
			t.Logf("stripe-mock's log:\n%s", b)
		}
	})
	wait.For(t, 30*time.Second, "stripe-mock to listen on "+addr, func() bool {
		select {
		case <-exited:
			b, _ := os.ReadFile(logPath)
			t.Fatalf("stripe-mock exited before it listened:\n%s", b)
		default:
		}
		conn, err := net.DialTimeout("tcp", addr, time.Second)
		if err != nil {
			return false
		}
		conn.Close()
		return true
	})
	return "http://" + addr
}

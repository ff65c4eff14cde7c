package main

import (
	"bufio"
	_ "embed"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"example.com/billing/internal/dev/fakepsp"
)

// The fake payment provider of a scenario runs in one of three ways
// (-provider):
//
//   - inprocess: fakepsp inside the benchmark's process, behind a counter
//     of the requests in flight (the default: nothing between the two).
//   - process: fakepsp as a process of its own (`billing fakepsp`), read
//     through its GET /_stats.
//   - node: a stub in Node.js (node-psp.mjs), as a seed in TypeScript
//     would have one: http.createServer, a setTimeout per request, Node's
//     default listen backlog (511) and keep-alive. An independent
//     measurement ran billing against such a stub.
const (
	providerInProcess = "inprocess"
	providerProcess   = "process"
	providerNode      = "node"
)

//go:embed node-psp.mjs
var nodeStub []byte

// provider is a running fake provider.
type provider struct {
	url   string
	trust []string // SSL_CERT_FILE for serve, with -provider-http2
	// stats reads the provider's counters; inFlight the requests it is
	// answering now, and how many it received so far.
	stats    func() (fakepsp.Stats, error)
	inFlight func() (now, received int64, err error)
	counted  *inFlight // in process: exact most and mean in flight
	close    func()
}

func startProvider(kind string, sc scenario, opts runOptions) (*provider, error) {
	switch kind {
	case providerInProcess, "":
		return startInProcess(sc, opts)
	case providerProcess:
		addr := freeAddr()
		cmd := exec.Command(opts.fakepspBinary, "fakepsp", "--addr", addr, "--latency", sc.latency.String(),
			"--rate-limit", fmt.Sprint(sc.rateLimit), "--seed", "1")
		cmd.Env = []string{"PATH=" + os.Getenv("PATH")}
		return startExternal(cmd, "http://"+addr)
	case providerNode:
		dir, err := os.MkdirTemp("", "bench-node-psp-")
		if err != nil {
			return nil, err
		}
		script := filepath.Join(dir, "node-psp.mjs")
		if err := os.WriteFile(script, nodeStub, 0o644); err != nil {
			os.RemoveAll(dir)
			return nil, err
		}
		addr := freeAddr()
		_, port, _ := net.SplitHostPort(addr)
		cmd := exec.Command("node", script)
		cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "PORT=" + port, fmt.Sprintf("LATENCY_MS=%d", sc.latency.Milliseconds())}
		p, err := startExternal(cmd, "http://"+addr)
		if err != nil {
			os.RemoveAll(dir)
			return nil, err
		}
		closeNode := p.close
		p.close = func() { closeNode(); os.RemoveAll(dir) }
		return p, nil
	}
	return nil, fmt.Errorf("-provider %q: want inprocess, process or node", kind)
}

func startInProcess(sc scenario, opts runOptions) (*provider, error) {
	psp := fakepsp.New(fakepsp.Options{Latency: sc.latency, RateLimit: sc.rateLimit, Seed: 1})
	counted := &inFlight{next: psp}
	srv := httptest.NewUnstartedServer(counted)
	p := &provider{counted: counted, stats: func() (fakepsp.Stats, error) { return psp.Stats(), nil },
		inFlight: func() (int64, int64, error) { return counted.now.Load(), counted.received.Load(), nil }}
	if opts.providerHTTP2 {
		srv.EnableHTTP2 = true
		srv.StartTLS()
		// serve trusts the test server's certificate as Go does a
		// system's: SSL_CERT_FILE.
		ca := filepath.Join(os.TempDir(), fmt.Sprintf("bench-provider-%d.pem", os.Getpid()))
		if err := os.WriteFile(ca, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw}), 0o644); err != nil {
			srv.Close()
			return nil, err
		}
		p.trust = []string{"SSL_CERT_FILE=" + ca}
		p.close = func() { srv.Close(); os.Remove(ca) }
	} else {
		srv.Start()
		p.close = srv.Close
	}
	p.url = srv.URL
	return p, nil
}

// startExternal starts a provider process serving at url and waits until
// its GET /_stats answers.
func startExternal(cmd *exec.Cmd, url string) (*provider, error) {
	logs, err := os.CreateTemp("", "bench-provider-*.log")
	if err != nil {
		return nil, err
	}
	cmd.Stdout, cmd.Stderr = logs, logs
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		logs.Close()
		os.Remove(logs.Name())
		return nil, fmt.Errorf("start the provider: %w", err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	stop := func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(5 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
		}
		logs.Close()
		os.Remove(logs.Name())
	}
	client := &http.Client{Timeout: 2 * time.Second}
	stats := func() (fakepsp.Stats, error) {
		var st fakepsp.Stats
		resp, err := client.Get(url + "/_stats")
		if err != nil {
			return st, err
		}
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return st, fmt.Errorf("GET /_stats: %s", resp.Status)
		}
		if err := json.NewDecoder(bufio.NewReader(resp.Body)).Decode(&st); err != nil {
			return st, fmt.Errorf("GET /_stats: %w", err)
		}
		return st, nil
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		if _, err := stats(); err == nil {
			break
		}
		select {
		case <-exited:
			return nil, fmt.Errorf("the provider exited at start (%s)", cmd.Path)
		default:
		}
		if time.Now().After(deadline) {
			stop()
			return nil, errors.New("the provider did not answer GET /_stats within 30 s")
		}
		time.Sleep(50 * time.Millisecond)
	}
	return &provider{url: url, stats: stats, close: stop, inFlight: func() (int64, int64, error) {
		st, err := stats()
		if err != nil {
			return 0, 0, err
		}
		return st.Requests - decided(st), st.Requests, nil
	}}, nil
}

// decided counts the requests a provider answered or is about to: each
// request counts in exactly one of these once it is decided (fakepsp's
// Stats). Charges and declines are decided after the latency, the rest on
// arrival; the benchmark's traffic has only the first two.
func decided(st fakepsp.Stats) int64 {
	return st.ChargesCreated + st.Declines + st.Replays + st.Conflicts + st.Mismatches + st.BadRequests +
		st.Unauthorized + st.InjectedFailures + st.DownRejections + st.RateLimited
}

// inFlight counts the provider requests (POST /v1/charges) being answered:
// the most at once, and their summed duration, which divided by the
// measured time is the mean number in flight.
type inFlight struct {
	next          http.Handler
	now, max      atomic.Int64
	received      atomic.Int64
	busy          atomic.Int64 // nanoseconds
	firstReceived atomic.Int64 // UnixNano
}

func (f *inFlight) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost || r.URL.Path != "/v1/charges" {
		f.next.ServeHTTP(w, r)
		return
	}
	started := time.Now()
	f.firstReceived.CompareAndSwap(0, started.UnixNano())
	f.received.Add(1)
	n := f.now.Add(1)
	for m := f.max.Load(); n > m && !f.max.CompareAndSwap(m, n); m = f.max.Load() {
	}
	defer func() {
		f.busy.Add(int64(time.Since(started)))
		f.now.Add(-1)
	}()
	f.next.ServeHTTP(w, r)
}

// sample is the provider at one moment of a scenario: the requests it
// received so far and those it is answering.
type sample struct {
	at                 time.Duration // since the throughput window started
	received, inFlight int64
}

// sampler reads the provider every sampleProvider until stopped.
type sampler struct {
	p     *provider
	start time.Time
	stop  chan struct{}
	done  chan struct{}

	mu      sync.Mutex
	samples []sample
}

// sampleProvider is how often the provider's requests are counted: fine
// enough for the ramp and the tail of a run that lasts seconds, cheap for
// a provider read over HTTP.
const sampleProvider = 50 * time.Millisecond

func startSampler(p *provider, start time.Time) *sampler {
	s := &sampler{p: p, start: start, stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(s.done)
		t := time.NewTicker(sampleProvider)
		defer t.Stop()
		for {
			now, received, err := p.inFlight()
			if err == nil {
				s.mu.Lock()
				s.samples = append(s.samples, sample{at: time.Since(s.start), received: received, inFlight: now})
				s.mu.Unlock()
			}
			select {
			case <-s.stop:
				return
			case <-t.C:
			}
		}
	}()
	return s
}

func (s *sampler) finish() []sample {
	close(s.stop)
	<-s.done
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.samples
}

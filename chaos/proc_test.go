//go:build chaos

package chaos_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"time"
)

// proc is a running billing process (serve or fakepsp).
type proc struct {
	name    string
	cmd     *exec.Cmd
	logPath string
	started time.Time

	done     chan struct{} // closed when the process has exited
	exitErr  error         // cmd.Wait's error, valid once done is closed
	exitedAt time.Time

	mu       sync.Mutex
	signaled bool // the suite sent it a signal: its exit is expected
}

// startProc starts the billing binary with args and env (a full
// environment: nothing of the test's own is inherited but PATH and HOME),
// its stdout and stderr appended to logPath. stdout, if not nil, also
// receives the standard output.
func startProc(name, logPath string, env map[string]string, stdout io.Writer, args ...string) (*proc, error) {
	return startProcIn(nil, name, logPath, env, stdout, args...)
}

// startProcIn is startProc with the binary's command line prefixed by
// wrap (a host's ip netns exec), nil for none. The wrapper must exec the
// binary in place, so that the pid, signals and PDEATHSIG reach it.
func startProcIn(wrap []string, name, logPath string, env map[string]string, stdout io.Writer, args ...string) (*proc, error) {
	return startBinaryIn(suite.binary, wrap, name, logPath, env, stdout, args...)
}

// startBinaryIn is startProcIn for another billing binary (another
// release's).
func startBinaryIn(binary string, wrap []string, name, logPath string, env map[string]string, stdout io.Writer, args ...string) (*proc, error) {
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	argv := append(append(append([]string(nil), wrap...), binary), args...)
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + os.Getenv("HOME")}
	for k, v := range env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	cmd.Stderr = logf
	cmd.Stdout = logf
	if stdout != nil {
		cmd.Stdout = io.MultiWriter(logf, stdout)
	}
	// The process dies with the suite, even when a timeout kills the suite.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	p := &proc{name: name, cmd: cmd, logPath: logPath, done: make(chan struct{})}
	err = startOnOwnThread(cmd, func(err error) {
		p.exitErr = err
		p.exitedAt = time.Now()
		logf.Close()
		close(p.done)
	})
	if err != nil {
		logf.Close()
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	p.started = time.Now()
	return p, nil
}

func (p *proc) pid() int { return p.cmd.Process.Pid }

func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// signal sends sig and records that the exit that follows is expected.
func (p *proc) signal(sig syscall.Signal) {
	p.mu.Lock()
	p.signaled = true
	p.mu.Unlock()
	_ = p.cmd.Process.Signal(sig)
}

func (p *proc) wasSignaled() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.signaled
}

// kill9 kills the process with SIGKILL and waits for it to be gone.
func (p *proc) kill9() {
	p.signal(syscall.SIGKILL)
	<-p.done
}

// terminate sends SIGTERM and waits up to limit for the exit. It returns
// how long the exit took and the exit error (nil for status 0). A process
// still running at limit gets SIGQUIT, so that the Go runtime writes every
// goroutine's stack to its log, and then SIGKILL.
func (p *proc) terminate(limit time.Duration) (time.Duration, error) {
	sent := time.Now()
	p.signal(syscall.SIGTERM)
	select {
	case <-p.done:
		took := p.exitedAt.Sub(sent)
		if p.exitErr != nil {
			return took, fmt.Errorf("%s exited with %v after SIGTERM", p.name, p.exitErr)
		}
		return took, nil
	case <-time.After(limit):
	}
	_ = p.cmd.Process.Signal(syscall.SIGQUIT)
	select {
	case <-p.done:
	case <-time.After(5 * time.Second):
		p.kill9()
	}
	return time.Since(sent), fmt.Errorf("%s did not exit within %s of SIGTERM; sent SIGQUIT, goroutine dump in %s", p.name, limit, p.logPath)
}

// tail returns the last n lines of the process's log.
func (p *proc) tail(n int) string {
	return tailFile(p.logPath, n)
}

func tailFile(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// httpClient is for the suite's own calls: short timeouts, no keep-alive
// surprises across restarts.
var httpClient = &http.Client{
	Timeout:   5 * time.Second,
	Transport: &http.Transport{DisableKeepAlives: true},
}

// httpDo sends a request and returns the status and body; status 0 when
// nothing answered.
func httpDo(method, url string, body []byte) (int, []byte, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, url, bytes.NewReader(body))
	if err != nil {
		return 0, nil, err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := httpClient.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, b, err
}

// --- billing fakepsp as a process ---

// psp is `billing fakepsp` (the developer build's) running as a process of
// its own.
type psp struct {
	*proc
	url string
}

var urlPattern = regexp.MustCompile(`https?://127\.0\.0\.1:[0-9]+`)

// startPSP starts `billing fakepsp` on a free port with env (its API key
// and webhook secret, nil for none) and waits for it.
func startPSP(logPath string, env map[string]string, args ...string) (*psp, error) {
	pr, pw := io.Pipe()
	p, err := startBinaryIn(suite.devBinary, nil, "fakepsp", logPath, env, pw, append([]string{"fakepsp", "--addr", "127.0.0.1:0"}, args...)...)
	if err != nil {
		return nil, err
	}
	found := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(pr)
		for sc.Scan() {
			if u := urlPattern.FindString(sc.Text()); u != "" {
				found <- u
				break
			}
		}
		_, _ = io.Copy(io.Discard, pr) // keep the pipe flowing
	}()
	go func() { <-p.done; pw.Close() }()
	select {
	case u := <-found:
		s := &psp{proc: p, url: u}
		if code, _, _ := httpDo(http.MethodGet, u+"/_stats", nil); code != http.StatusOK {
			p.kill9()
			return nil, fmt.Errorf("fakepsp at %s: GET /_stats answered %d", u, code)
		}
		return s, nil
	case <-p.done:
		return nil, fmt.Errorf("fakepsp exited at start: %v\n%s", p.exitErr, p.tail(20))
	case <-time.After(15 * time.Second):
		p.kill9()
		return nil, fmt.Errorf("fakepsp printed no address within 15s\n%s", p.tail(20))
	}
}

// pspStats is fakepsp's GET /_stats.
type pspStats struct {
	Requests           int64 `json:"requests"`
	DistinctKeys       int64 `json:"distinctKeys"`
	ChargesCreated     int64 `json:"chargesCreated"`
	Declines           int64 `json:"declines"`
	Replays            int64 `json:"replays"`
	Conflicts          int64 `json:"conflicts"`
	Mismatches         int64 `json:"mismatches"`
	BadRequests        int64 `json:"badRequests"`
	Unauthorized       int64 `json:"unauthorized"`
	InjectedFailures   int64 `json:"injectedFailures"`
	DownRejections     int64 `json:"downRejections"`
	Resets             int64 `json:"resets"`
	OrdersChargedTwice int64 `json:"ordersChargedTwice"`
}

// pspCharge is one charge of fakepsp's GET /v1/charges.
type pspCharge struct {
	ID             string `json:"id"`
	IdempotencyKey string `json:"idempotencyKey"`
	OrderID        int64  `json:"orderId"`
	CustomerID     int64  `json:"customerId"`
	Amount         int64  `json:"amount"`
	Currency       string `json:"currency"`
	Status         string `json:"status"`
}

func (s *psp) getJSON(path string, v any) error {
	code, body, err := httpDo(http.MethodGet, s.url+path, nil)
	if err != nil {
		return err
	}
	if code != http.StatusOK {
		return fmt.Errorf("GET %s: %d %s", path, code, body)
	}
	return json.Unmarshal(body, v)
}

func (s *psp) stats() (pspStats, error) {
	var st pspStats
	err := s.getJSON("/_stats", &st)
	return st, err
}

// pspClient is what fakepsp's GET /_stats says of one client address.
type pspClient struct {
	Requests int64     `json:"requests"`
	Last     time.Time `json:"last"`
}

// client returns what the provider saw of the client address ip (a host's
// namespace address): the charge requests it sent, and when the last one
// arrived. The zero value when it sent none.
func (s *psp) client(ip string) (pspClient, error) {
	var st struct {
		Clients map[string]pspClient `json:"clients"`
	}
	err := s.getJSON("/_stats", &st)
	return st.Clients[ip], err
}

func (s *psp) charges() ([]pspCharge, error) {
	var list struct {
		Data []pspCharge `json:"data"`
	}
	err := s.getJSON("/v1/charges", &list)
	return list.Data, err
}

func (s *psp) post(path string) error {
	code, body, err := httpDo(http.MethodPost, s.url+path, nil)
	if err != nil {
		return err
	}
	if code != http.StatusOK {
		return fmt.Errorf("POST %s: %d %s", path, code, body)
	}
	return nil
}

func (s *psp) down() error { return s.post("/_down") }
func (s *psp) up() error   { return s.post("/_up") }

// setFaults changes some of the provider's fault options, keeping the
// others: PUT /_faults replaces them all.
func (s *psp) setFaults(change func(map[string]any)) error {
	var opts map[string]any
	if err := s.getJSON("/_faults", &opts); err != nil {
		return err
	}
	change(opts)
	body, err := json.Marshal(opts)
	if err != nil {
		return err
	}
	code, answer, err := httpDo(http.MethodPut, s.url+"/_faults", body)
	if err != nil {
		return err
	}
	if code != http.StatusOK {
		return fmt.Errorf("PUT /_faults: %d %s", code, answer)
	}
	return nil
}

// --- billing serve as a process ---

// consumer is one `billing serve` process of the consumer group.
type consumer struct {
	*proc
	addr string   // HTTP_ADDR
	host *netHost // the network namespace it runs in, nil on the machine
	// webhook is its WEBHOOK_ADDR in a provider's scenario (stripe,
	// adyen), "" elsewhere.
	webhook string
}

func (c *consumer) get(path string) int {
	code, _ := c.getBody(path)
	return code
}

// getBody returns the status and body of GET path; status 0 when nothing
// answered within httpClient's timeout (5s).
func (c *consumer) getBody(path string) (int, string) {
	code, body, err := httpDo(http.MethodGet, "http://"+c.addr+path, nil)
	if err != nil {
		return 0, err.Error()
	}
	return code, string(body)
}

// healthzOK judges a /healthz answer: 200, or no answer from a process
// that has exited, that the suite signaled (a SIGTERM closes the HTTP
// server milliseconds before the exit is recorded), or that was started
// so recently that its HTTP server may not listen yet.
func (c *consumer) healthzOK(code int) bool {
	return code == http.StatusOK || c.exited() ||
		(code == 0 && (c.wasSignaled() || time.Since(c.started) < 5*time.Second))
}

// waitReady waits until /readyz answers 200.
func (c *consumer) waitReady(timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		if c.exited() {
			return fmt.Errorf("%s exited before it was ready: %v\n%s", c.name, c.exitErr, c.tail(30))
		}
		if c.get("/readyz") == http.StatusOK {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s not ready within %s\n%s", c.name, timeout, c.tail(30))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

var errNotRunning = errors.New("no consumer is running")

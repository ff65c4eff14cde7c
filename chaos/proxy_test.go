//go:build chaos

package chaos_test

import (
	"math/rand/v2"
	"net"
	"sync"
	"time"
)

// tcpProxy is a TCP endpoint the suite controls, on 127.0.0.1: it forwards
// each connection to its target, and can
//
//   - delay every chunk of bytes by a latency with jitter, per direction,
//     keeping their order (this kernel has no netem qdisc);
//   - move to another target (setTarget), closing the connections it
//     holds, as a failover endpoint (a virtual IP, a DNS name, a proxy)
//     does when the primary moves;
//   - cut the path (cut): its connections are closed and new ones are
//     closed as soon as they are accepted, as a link that is down, for
//     good (the failover that needs it never heals the link).
type tcpProxy struct {
	name string
	ln   net.Listener

	mu     sync.Mutex
	target string
	delay  time.Duration
	jitter time.Duration
	rng    *rand.Rand
	down   bool
	conns  map[net.Conn]struct{} // both ends of every forwarded connection
	closed bool
	// delayed counts the chunks forwarded with a delay: the proof that
	// the connections it was meant to slow down went through it.
	delayed int64
	wg      sync.WaitGroup
}

// startProxy listens on a free port of 127.0.0.1 and forwards to target.
func startProxy(name, target string, seed uint64) (*tcpProxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &tcpProxy{name: name, ln: ln, target: target, conns: map[net.Conn]struct{}{}, rng: rand.New(rand.NewPCG(seed, 0x70726f7879))}
	p.wg.Go(p.acceptLoop)
	return p, nil
}

func (p *tcpProxy) port() int    { return p.ln.Addr().(*net.TCPAddr).Port }
func (p *tcpProxy) addr() string { return p.ln.Addr().String() }

func (p *tcpProxy) acceptLoop() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return // closed
		}
		p.mu.Lock()
		target, down, closed := p.target, p.down, p.closed
		p.mu.Unlock()
		if down || closed {
			c.Close()
			continue
		}
		p.wg.Go(func() { p.forward(c, target) })
	}
}

// forward connects c to target and copies both ways until either side
// ends.
func (p *tcpProxy) forward(c net.Conn, target string) {
	up, err := net.DialTimeout("tcp", target, 5*time.Second)
	if err != nil {
		c.Close() // as a refused connection: the client sees it closed
		return
	}
	if !p.track(c, up) {
		c.Close()
		up.Close()
		return
	}
	defer p.untrack(c, up)
	var wg sync.WaitGroup
	wg.Go(func() { p.pipe(up, c) })
	wg.Go(func() { p.pipe(c, up) })
	wg.Wait()
}

// track records a forwarded connection's two ends, unless the proxy is
// closed or cut meanwhile.
func (p *tcpProxy) track(conns ...net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed || p.down {
		return false
	}
	for _, c := range conns {
		p.conns[c] = struct{}{}
	}
	return true
}

func (p *tcpProxy) untrack(conns ...net.Conn) {
	p.mu.Lock()
	for _, c := range conns {
		delete(p.conns, c)
		c.Close()
	}
	p.mu.Unlock()
}

// chunk is bytes read from one side, to be written to the other at due.
type chunk struct {
	data []byte
	due  time.Time
}

// pipe copies src to dst, each chunk delayed by the proxy's latency at the
// moment it was read, never before the chunk read before it. When src
// ends, dst's write side is closed after the last chunk; when either
// fails, both are closed.
func (p *tcpProxy) pipe(dst, src net.Conn) {
	chunks := make(chan chunk, 256) // bounded: a slow reader holds back the writer, as TCP does
	go func() {
		defer close(chunks)
		var last time.Time
		for {
			buf := make([]byte, 32<<10)
			n, err := src.Read(buf)
			if n > 0 {
				due := time.Now().Add(p.latency())
				if due.Before(last) {
					due = last // never overtake the chunk before
				}
				last = due
				chunks <- chunk{data: buf[:n], due: due}
			}
			if err != nil {
				return
			}
		}
	}()
	for ch := range chunks {
		time.Sleep(time.Until(ch.due))
		if _, err := dst.Write(ch.data); err != nil {
			src.Close()
			dst.Close()
			for range chunks { // let the reader finish
			}
			return
		}
	}
	if tc, ok := dst.(*net.TCPConn); ok {
		_ = tc.CloseWrite()
	}
}

// latency is one chunk's delay: delay ± jitter, uniform.
func (p *tcpProxy) latency() time.Duration {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.delay == 0 {
		return 0
	}
	p.delayed++
	d := p.delay
	if p.jitter > 0 {
		d += time.Duration(p.rng.Int64N(int64(2*p.jitter))) - p.jitter
	}
	return max(d, 0)
}

// delayedChunks returns how many chunks were forwarded with a delay.
func (p *tcpProxy) delayedChunks() int64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.delayed
}

// setDelay sets the latency added to each chunk from now on.
func (p *tcpProxy) setDelay(delay, jitter time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.delay, p.jitter = delay, jitter
}

// setTarget forwards new connections to target and closes the ones it
// holds: their clients reconnect, to the new target.
func (p *tcpProxy) setTarget(target string) {
	p.mu.Lock()
	p.target = target
	p.mu.Unlock()
	p.closeConns()
}

// cut closes every connection and refuses new ones until restore.
func (p *tcpProxy) cut() {
	p.mu.Lock()
	p.down = true
	p.mu.Unlock()
	p.closeConns()
}

func (p *tcpProxy) closeConns() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for c := range p.conns {
		c.Close()
	}
}

// close stops the proxy and every connection through it.
func (p *tcpProxy) close() {
	p.mu.Lock()
	p.closed = true
	p.mu.Unlock()
	p.ln.Close()
	p.closeConns()
	p.wg.Wait()
}

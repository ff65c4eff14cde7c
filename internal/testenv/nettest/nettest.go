// Package nettest gives tests a real network fault: a TCP forwarder in
// front of a server, whose packets the kernel drops on demand (iptables),
// so that a client sees exactly what a network partition shows it —
// requests that neither answer nor fail — and nothing in the code under
// test knows.
package nettest

import (
	"io"
	"net"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"testing"
)

// Forward relays TCP connections from a port of its own on 127.0.0.1 to
// target until the test ends, and returns its address.
func Forward(t testing.TB, target string) *net.TCPAddr {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var conns []net.Conn
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	wg.Go(func() {
		for {
			in, err := ln.Accept()
			if err != nil {
				return
			}
			out, err := net.Dial("tcp", target)
			if err != nil {
				in.Close()
				continue
			}
			mu.Lock()
			conns = append(conns, in, out)
			mu.Unlock()
			wg.Go(func() { _, _ = io.Copy(out, in); out.Close() })
			wg.Go(func() { _, _ = io.Copy(in, out); in.Close() })
		}
	})
	return ln.Addr().(*net.TCPAddr)
}

// Cut drops every packet to and from port on the loopback interface, as a
// network partition does, until the returned function heals it or the test
// ends. Connections through the port neither answer nor fail; new ones are
// not accepted.
func Cut(t testing.TB, port int) (heal func()) {
	t.Helper()
	iptables := PacketFilter(t)
	p := strconv.Itoa(port)
	rules := [][]string{
		{"INPUT", "-i", "lo", "-p", "tcp", "--dport", p, "-j", "DROP"},
		{"INPUT", "-i", "lo", "-p", "tcp", "--sport", p, "-j", "DROP"},
	}
	for _, r := range rules {
		if out, err := exec.Command(iptables, append([]string{"-I"}, r...)...).CombinedOutput(); err != nil {
			t.Fatalf("iptables -I %v: %v\n%s", r, err, out)
		}
	}
	var once sync.Once
	heal = func() {
		once.Do(func() {
			for _, r := range rules {
				if out, err := exec.Command(iptables, append([]string{"-D"}, r...)...).CombinedOutput(); err != nil {
					t.Errorf("iptables -D %v: %v\n%s", r, err, out)
				}
			}
		})
	}
	t.Cleanup(heal)
	return heal
}

// PacketFilter returns the path of iptables, or skips the test where it
// cannot drop packets (not root, no iptables). Under CI=true, where .ci/run
// installs iptables and runs as root, it fails instead of skipping.
func PacketFilter(t testing.TB) string {
	t.Helper()
	path, err := exec.LookPath("iptables")
	why := ""
	switch {
	case os.Geteuid() != 0:
		why = "dropping packets needs root"
	case err != nil:
		why = "dropping packets needs iptables (apt-get install iptables; .ci/packages)"
	}
	if why == "" {
		return path
	}
	if os.Getenv("CI") == "true" {
		t.Fatal(why)
	}
	t.Skip(why)
	return ""
}

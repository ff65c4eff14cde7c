// Package freeport picks loopback ports for servers that want a port
// rather than a listener: the throwaway PostgreSQL and Apache Kafka of the
// tests and the chaos suite, and the demo's HTTP server. A port is free
// when returned; the server binds it a moment later, so another process
// may take it first, which these callers accept (a retried test, a demo
// started again). Nothing in a production path picks a port this way.
package freeport

import "net"

// Ports returns n distinct ports of 127.0.0.1 that are free now.
func Ports(n int) ([]int, error) {
	// Every listener stays open until all are picked, so that the kernel
	// gives n different ports.
	var lns []net.Listener
	defer func() {
		for _, ln := range lns {
			ln.Close()
		}
	}()
	ports := make([]int, 0, n)
	for range n {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		lns = append(lns, ln)
		ports = append(ports, ln.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

// Port returns one port of 127.0.0.1 that is free now.
func Port() (int, error) {
	ports, err := Ports(1)
	if err != nil {
		return 0, err
	}
	return ports[0], nil
}

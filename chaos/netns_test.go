//go:build chaos

package chaos_test

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
)

// A "host" is a network namespace of its own, joined to the machine by a
// veth pair, in which one billing serve runs as it would on a machine of
// its own: the suite can then cut or degrade that replica's network
// without billing knowing. serve keeps the same configuration as the
// others (KAFKA_BROKERS, DATABASE_URL and PAYMENT_BASE_URL on 127.0.0.1):
// inside the namespace every TCP connection to 127.0.0.1 is sent
// (DNAT, then MASQUERADE) over the veth to the machine, where a rule of
// the suite's own chain sends it (DNAT) to the machine's 127.0.0.1, the
// source address staying the namespace's: PostgreSQL and fakepsp see each
// host's replica as a client of its own (fakepsp's GET /_stats "clients").
//
// Faults are iptables rules inside the namespace (cut, lossy), which
// disappear with it; the machine's side holds only the DNAT rules, in one
// chain of the suite's own in the nat table.
//
// Every name the suite creates in the kernel carries netPrefix and the
// suite's pid: namespaces bchx<pid>-<n>, veth pairs bchx<pid>h<n> (machine
// side) and bchx<pid>n<n>, the nat chain BCHX<pid> and tmpfs mounts of
// source bchx<pid>. A suite that was killed leaves them behind; the next one
// removes those of a pid that is no longer a running suite (cleanStale).
const netPrefix = "bchx"

// hostNet is the address range of the hosts: a /30 per host, 10.231.n.0/30
// (the machine's end .1, the namespace's .2). The suite's PostgreSQL
// clusters trust it (pgCluster).
const hostNet = "10.231.0.0/16"

// netTools are the programs the network faults need, from iproute2 and
// iptables (.ci/run installs them).
var netTools = []string{"ip", "iptables"}

// netState is the machine's side of the suite's hosts: the nat chain and
// the hosts made so far. It is set up on first use, torn down at the end
// of the suite.
var netState struct {
	mu      sync.Mutex
	chain   string // BCHX<pid>, jumped to from PREROUTING; "" until set up
	next    int    // the next host number
	subnets map[int]bool
}

// command runs a program and returns its error with its output.
func command(name string, args ...string) error {
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// commands runs each argv in turn and stops at the first error.
func commands(argvs ...[]string) error {
	for _, a := range argvs {
		if err := command(a[0], a[1:]...); err != nil {
			return err
		}
	}
	return nil
}

// netFaultsAvailable says why the network faults cannot be injected here,
// nil when they can.
func netFaultsAvailable() error {
	if os.Geteuid() != 0 {
		return errors.New("network faults need root (network namespaces, veth pairs, iptables)")
	}
	for _, tool := range netTools {
		if _, err := exec.LookPath(tool); err != nil {
			return fmt.Errorf("network faults need %s (Debian: apt-get install iproute2 iptables; .ci/run does): %w", tool, err)
		}
	}
	if err := command("iptables", "-t", "nat", "-S", "PREROUTING"); err != nil {
		return fmt.Errorf("iptables cannot read the nat table: %w", err)
	}
	return nil
}

// setUpNet creates the suite's nat chain, once.
func setUpNet() error {
	netState.mu.Lock()
	defer netState.mu.Unlock()
	if netState.chain != "" {
		return nil
	}
	chain := fmt.Sprintf("%s%d", strings.ToUpper(netPrefix), os.Getpid())
	err := commands(
		[]string{"iptables", "-t", "nat", "-N", chain},
		[]string{"iptables", "-t", "nat", "-A", "PREROUTING", "-j", chain},
	)
	if err != nil {
		removeChain(chain)
		return err
	}
	netState.chain = chain
	netState.subnets = usedSubnets()
	return nil
}

// tearDownNet removes the suite's nat chain (its hosts are gone already).
func tearDownNet() {
	netState.mu.Lock()
	defer netState.mu.Unlock()
	if netState.chain != "" {
		removeChain(netState.chain)
		netState.chain = ""
	}
}

// removeChain removes a nat chain of the suite's and its jump, ignoring
// what is already gone.
func removeChain(chain string) {
	// One jump, unless a killed suite was interrupted between two
	// attempts: -D removes one at a time, and fails once none is left.
	for range 10 {
		if command("iptables", "-t", "nat", "-D", "PREROUTING", "-j", chain) != nil {
			break
		}
	}
	_ = command("iptables", "-t", "nat", "-F", chain)
	_ = command("iptables", "-t", "nat", "-X", chain)
}

// usedSubnets returns the n of every 10.231.n.x address the machine has,
// so that a host never takes a subnet in use.
func usedSubnets() map[int]bool {
	used := map[int]bool{}
	ifaces, err := net.InterfaceAddrs()
	if err != nil {
		return used
	}
	_, base, _ := net.ParseCIDR(hostNet)
	for _, a := range ifaces {
		if ipn, ok := a.(*net.IPNet); ok && base.Contains(ipn.IP) {
			used[int(ipn.IP.To4()[2])] = true
		}
	}
	return used
}

// netHost is one network namespace with its veth pair.
type netHost struct {
	ns           string // namespace
	hostIf, nsIf string // the veth pair's ends
	hostIP, nsIP string // 10.231.n.1, 10.231.n.2
	mu           sync.Mutex
	rules        [][]string // this host's rules in the suite's nat chain
	faulted      bool       // fault rules in the namespace's filter table
}

// newHost creates a host: namespace, veth pair, addresses, routes and the
// NAT rules that take its connections to 127.0.0.1 to the machine's.
func newHost() (*netHost, error) {
	if err := setUpNet(); err != nil {
		return nil, err
	}
	netState.mu.Lock()
	n := netState.next
	netState.next++
	subnet := -1
	for s := 0; s < 256; s++ {
		if !netState.subnets[s] {
			subnet = s
			netState.subnets[s] = true
			break
		}
	}
	chain := netState.chain
	netState.mu.Unlock()
	if subnet < 0 {
		return nil, fmt.Errorf("no free /30 left in %s", hostNet)
	}
	pid := os.Getpid()
	h := &netHost{
		ns:     fmt.Sprintf("%s%d-%d", netPrefix, pid, n),
		hostIf: fmt.Sprintf("%s%dh%d", netPrefix, pid, n),
		nsIf:   fmt.Sprintf("%s%dn%d", netPrefix, pid, n),
		hostIP: fmt.Sprintf("10.231.%d.1", subnet),
		nsIP:   fmt.Sprintf("10.231.%d.2", subnet),
	}
	if len(h.hostIf) > 15 {
		return nil, fmt.Errorf("interface name %s is longer than Linux's 15 characters", h.hostIf)
	}
	in := func(args ...string) []string { return append([]string{"ip", "netns", "exec", h.ns}, args...) }
	err := commands(
		[]string{"ip", "netns", "add", h.ns},
		[]string{"ip", "link", "add", h.hostIf, "type", "veth", "peer", "name", h.nsIf, "netns", h.ns},
		[]string{"ip", "addr", "add", h.hostIP + "/30", "dev", h.hostIf},
		[]string{"ip", "link", "set", h.hostIf, "up"},
		[]string{"ip", "-n", h.ns, "addr", "add", h.nsIP + "/30", "dev", h.nsIf},
		[]string{"ip", "-n", h.ns, "link", "set", h.nsIf, "up"},
		[]string{"ip", "-n", h.ns, "link", "set", "lo", "up"},
		[]string{"ip", "-n", h.ns, "route", "add", "default", "via", h.hostIP},
		// Packets to 127.0.0.1 may leave the namespace, and arrive on the
		// machine's veth end, only with route_localnet.
		in("sh", "-c", "echo 1 > /proc/sys/net/ipv4/conf/all/route_localnet"),
		[]string{"sh", "-c", fmt.Sprintf("echo 1 > /proc/sys/net/ipv4/conf/%s/route_localnet", h.hostIf)},
		in("iptables", "-t", "nat", "-A", "OUTPUT", "-d", "127.0.0.1", "-p", "tcp", "-j", "DNAT", "--to-destination", h.hostIP),
		in("iptables", "-t", "nat", "-A", "POSTROUTING", "-o", h.nsIf, "-j", "MASQUERADE"),
	)
	if err == nil {
		err = h.hostRule(chain, false, "-p", "tcp", "-j", "DNAT", "--to-destination", "127.0.0.1")
	}
	if err != nil {
		h.remove()
		return nil, fmt.Errorf("host %s: %w", h.ns, err)
	}
	return h, nil
}

// hostRule adds a rule for this host's veth to the suite's chain: at the
// top when first (it must win over the catch-all DNAT), else at the end.
func (h *netHost) hostRule(chain string, first bool, spec ...string) error {
	rule := append([]string{"-i", h.hostIf}, spec...)
	op := []string{"-A", chain}
	if first {
		op = []string{"-I", chain, "1"}
	}
	if err := command("iptables", append(append([]string{"-t", "nat"}, op...), rule...)...); err != nil {
		return err
	}
	h.mu.Lock()
	h.rules = append(h.rules, rule)
	h.mu.Unlock()
	return nil
}

// redirect sends this host's connections to port (as the namespace sees
// it, 127.0.0.1:port) to 127.0.0.1:to on the machine instead: a broker's
// port to the latency proxy in front of it, while the broker's metadata,
// which advertises 127.0.0.1:port, stays true.
func (h *netHost) redirect(port, to int) error {
	netState.mu.Lock()
	chain := netState.chain
	netState.mu.Unlock()
	return h.hostRule(chain, true, "-p", "tcp", "--dport", strconv.Itoa(port), "-j", "DNAT", "--to-destination", fmt.Sprintf("127.0.0.1:%d", to))
}

// wrap is the command line prefix that runs a program in the namespace.
// ip netns exec execs the program in place: the pid, and PDEATHSIG, stay.
func (h *netHost) wrap() []string { return []string{"ip", "netns", "exec", h.ns} }

// portList is ports as iptables' multiport wants them (at most 15).
func portList(ports []int) string {
	s := make([]string, len(ports))
	for i, p := range ports {
		s[i] = strconv.Itoa(p)
	}
	return strings.Join(s, ",")
}

// dropRules returns the filter rules, inside the namespace, that drop the
// TCP traffic to and from ports with probability p (1: all of it).
func (h *netHost) dropRules(ports []int, p float64) [][]string {
	var match []string
	if p < 1 {
		match = []string{"-m", "statistic", "--mode", "random", "--probability", strconv.FormatFloat(p, 'f', 4, 64)}
	}
	out := append([]string{"-A", "OUTPUT", "-p", "tcp", "-m", "multiport", "--dports", portList(ports)}, match...)
	in := append([]string{"-A", "INPUT", "-p", "tcp", "-m", "multiport", "--sports", portList(ports)}, match...)
	return [][]string{append(out, "-j", "DROP"), append(in, "-j", "DROP")}
}

// cut drops every packet between the host and ports (both directions):
// connections hang as in a real partition, new ones time out. The
// namespace's DNAT keeps the port, so the machine's ports are matched.
func (h *netHost) cut(ports ...int) error { return h.degrade(ports, 1) }

// lossy drops each packet between the host and ports with probability p.
func (h *netHost) lossy(p float64, ports ...int) error { return h.degrade(ports, p) }

func (h *netHost) degrade(ports []int, p float64) error {
	for _, r := range h.dropRules(ports, p) {
		if err := command("ip", append([]string{"netns", "exec", h.ns, "iptables"}, r...)...); err != nil {
			return err
		}
	}
	h.mu.Lock()
	h.faulted = true
	h.mu.Unlock()
	return nil
}

// dropped returns how many packets the host's fault rules dropped so far.
func (h *netHost) dropped() (int64, error) {
	out, err := exec.Command("ip", "netns", "exec", h.ns, "iptables", "-L", "-v", "-x", "-n").Output()
	if err != nil {
		return 0, fmt.Errorf("iptables -L in %s: %w", h.ns, err)
	}
	var n int64
	for _, line := range strings.Split(string(out), "\n") {
		f := strings.Fields(line)
		if len(f) > 2 && f[2] == "DROP" {
			pkts, err := strconv.ParseInt(f[0], 10, 64)
			if err == nil {
				n += pkts
			}
		}
	}
	return n, nil
}

// heal removes every fault rule of the host.
func (h *netHost) heal() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if !h.faulted {
		return nil
	}
	if err := command("ip", "netns", "exec", h.ns, "iptables", "-F"); err != nil {
		return err
	}
	h.faulted = false
	return nil
}

// remove deletes the host: its namespace (with the veth pair, its rules
// and sysctls) and its rules in the suite's chain. Whatever still runs in
// the namespace must have been stopped: a process keeps it alive.
func (h *netHost) remove() {
	netState.mu.Lock()
	chain := netState.chain
	netState.mu.Unlock()
	h.mu.Lock()
	rules := h.rules
	h.rules = nil
	h.mu.Unlock()
	for _, r := range rules {
		_ = command("iptables", append([]string{"-t", "nat", "-D", chain}, r...)...)
	}
	_ = command("ip", "netns", "del", h.ns)
	_ = command("ip", "link", "del", h.hostIf) // only if the namespace never got its end
}

// staleName matches the names the suite gives (netPrefix and a pid).
var staleName = regexp.MustCompile(`(?i)^` + netPrefix + `([0-9]+)`)

// suiteRunning reports whether pid is a running chaos suite (the test
// binary, chaos.test): its leftovers are not stale.
func suiteRunning(pid int) bool {
	if pid == os.Getpid() {
		return true
	}
	comm, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "comm"))
	return err == nil && strings.TrimSpace(string(comm)) == "chaos.test"
}

// stalePid returns the pid in a name the suite gave, when that suite no
// longer runs.
func stalePid(name string) (int, bool) {
	m := staleName.FindStringSubmatch(name)
	if m == nil {
		return 0, false
	}
	pid, err := strconv.Atoi(m[1])
	return pid, err == nil && !suiteRunning(pid)
}

// cleanStale removes what a killed suite left in the kernel: namespaces,
// veth ends, nat chains and tmpfs mounts. Nothing of a running suite, nor
// anything not named by the suite, is touched. It reports what it removed.
func cleanStale() []string {
	var removed []string
	if os.Geteuid() != 0 {
		return nil
	}
	if out, err := exec.Command("ip", "netns", "list").Output(); err == nil {
		for _, line := range strings.Split(string(out), "\n") {
			name, _, _ := strings.Cut(strings.TrimSpace(line), " ")
			if _, stale := stalePid(name); stale {
				if command("ip", "netns", "del", name) == nil {
					removed = append(removed, "netns "+name)
				}
			}
		}
	}
	if links, err := net.Interfaces(); err == nil {
		for _, l := range links {
			if _, stale := stalePid(l.Name); stale {
				if command("ip", "link", "del", l.Name) == nil {
					removed = append(removed, "link "+l.Name)
				}
			}
		}
	}
	if out, err := exec.Command("iptables", "-t", "nat", "-S").Output(); err == nil {
		for _, line := range strings.Split(string(out), "\n") {
			if name, ok := strings.CutPrefix(line, "-N "); ok {
				if _, stale := stalePid(name); stale {
					removeChain(name)
					removed = append(removed, "iptables nat chain "+name)
				}
			}
		}
	}
	if b, err := os.ReadFile("/proc/self/mounts"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			f := strings.Fields(line)
			if len(f) < 3 || f[2] != "tmpfs" {
				continue
			}
			if _, stale := stalePid(f[0]); stale {
				if command("umount", "-l", f[1]) == nil {
					removed = append(removed, "tmpfs "+f[1])
				}
			}
		}
	}
	return removed
}

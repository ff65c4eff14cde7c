package apachekafka

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/IBM/sarama"
)

// Node is one process of a cluster: a combined broker and controller.
type Node struct {
	ID int // broker and controller id

	dir   string
	java  string
	jars  string
	heap  int
	ports []int

	mu      sync.Mutex
	cmd     *exec.Cmd
	exited  chan struct{} // closed when the running process exited
	exitErr error
	paused  bool
}

// Addr is the node's plaintext listener.
func (n *Node) Addr() string { return fmt.Sprintf("127.0.0.1:%d", n.ports[portPlaintext]) }

// Dir is the node's directory: configuration, log dir and logs.
func (n *Node) Dir() string { return n.dir }

func (n *Node) writeConfig(c *Cluster) error {
	if s := c.opts.Security; s != nil {
		// A PEM key store is the key and its certificate chain in one file.
		key, err := os.ReadFile(s.KeyFile)
		if err != nil {
			return err
		}
		cert, err := os.ReadFile(s.CertFile)
		if err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(n.dir, "keystore.pem"), append(key, cert...), 0o600); err != nil {
			return err
		}
	}
	if err := writeProperties(filepath.Join(n.dir, "server.properties"), c.config(n)); err != nil {
		return err
	}
	log4j := strings.ReplaceAll(log4jConfig, "LOGFILE", filepath.Join(n.dir, "server.log"))
	return os.WriteFile(filepath.Join(n.dir, "log4j2.properties"), []byte(log4j), 0o600)
}

// log4jConfig sends Kafka's log to server.log in the node's directory, at
// INFO for Kafka and WARN for the chattier parts.
const log4jConfig = `status = warn
appender.file.type = File
appender.file.name = file
appender.file.fileName = LOGFILE
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = info
rootLogger.appenderRef.file.ref = file
logger.requestchannel.name = kafka.request.logger
logger.requestchannel.level = warn
logger.authorizer.name = kafka.authorizer.logger
logger.authorizer.level = warn
logger.cleaner.name = kafka.log.LogCleaner
logger.cleaner.level = warn
`

// format writes the node's log dir with the cluster id (Kafka's storage
// tool), and the SASL/SCRAM credentials when the cluster has any.
func (n *Node) format(ctx context.Context, c *Cluster) error {
	args := []string{"kafka.tools.StorageTool", "format", "--ignore-formatted",
		"--cluster-id", c.id, "--config", filepath.Join(n.dir, "server.properties")}
	if s := c.opts.Security; s != nil && s.User != "" {
		for _, m := range []string{"SCRAM-SHA-256", "SCRAM-SHA-512"} {
			args = append(args, "--add-scram", fmt.Sprintf("%s=[name=%s,password=%s]", m, s.User, s.Password))
		}
	}
	cmd := exec.CommandContext(ctx, n.java, append(n.jvmArgs(256), args...)...)
	cmd.Dir = n.dir
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("format node %d: %w\n%s", n.ID, err, out)
	}
	return nil
}

// jvmArgs are the JVM's options for a heap of heapMB, Kafka's own
// kafka-run-class.sh defaults otherwise.
func (n *Node) jvmArgs(heapMB int) []string {
	return []string{
		fmt.Sprintf("-Xmx%dm", heapMB), fmt.Sprintf("-Xms%dm", min(heapMB, 128)),
		"-XX:+UseG1GC", "-XX:MaxGCPauseMillis=20", "-XX:InitiatingHeapOccupancyPercent=35",
		"-XX:+ExplicitGCInvokesConcurrent", "-XX:+ExitOnOutOfMemoryError",
		"-Djava.awt.headless=true",
		"-Dlog4j2.configurationFile=" + filepath.Join(n.dir, "log4j2.properties"),
		"-cp", filepath.Join(n.jars, "*"),
	}
}

// Start starts the node's process (again, after Kill or Terminate).
func (n *Node) Start() error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.cmd != nil && !isClosed(n.exited) {
		return fmt.Errorf("node %d is running", n.ID)
	}
	out, err := os.OpenFile(filepath.Join(n.dir, "stdout.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	args := append(n.jvmArgs(n.heap), "kafka.Kafka", filepath.Join(n.dir, "server.properties"))
	cmd := exec.Command(n.java, args...)
	cmd.Dir = n.dir
	cmd.Stdout, cmd.Stderr = out, out
	// The JVM dies with this process, whatever ends it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
	exited := make(chan struct{})
	started := make(chan error, 1)
	go func() {
		// PDEATHSIG fires when the thread that started the child exits, not
		// the process: keep this goroutine on its thread until the child
		// is gone.
		runtime.LockOSThread()
		if err := cmd.Start(); err != nil {
			out.Close()
			started <- err
			close(exited)
			return
		}
		started <- nil
		err := cmd.Wait()
		out.Close()
		n.mu.Lock()
		n.exitErr = err
		n.mu.Unlock()
		close(exited)
	}()
	if err := <-started; err != nil {
		return fmt.Errorf("start node %d: %w", n.ID, err)
	}
	n.cmd, n.exited, n.exitErr, n.paused = cmd, exited, nil, false
	return nil
}

// answers checks that the node answers a metadata request on its own
// listener.
func (n *Node) answers() error {
	b := sarama.NewBroker(n.Addr())
	if err := b.Open(probeConfig()); err != nil {
		return fmt.Errorf("node %d: %w", n.ID, err)
	}
	defer b.Close()
	if _, err := b.GetMetadata(&sarama.MetadataRequest{Version: 7}); err != nil {
		return fmt.Errorf("node %d does not answer: %w", n.ID, err)
	}
	return nil
}

// Running reports whether the node's process is alive (paused counts).
func (n *Node) Running() bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.cmd != nil && !isClosed(n.exited)
}

// Pid is the node's process id, 0 when it is not running.
func (n *Node) Pid() int {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.cmd == nil || n.cmd.Process == nil || isClosed(n.exited) {
		return 0
	}
	return n.cmd.Process.Pid
}

// exitError says why a node that should run has exited.
func (n *Node) exitError() error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.cmd != nil && isClosed(n.exited) {
		return fmt.Errorf("node %d exited: %v", n.ID, n.exitErr)
	}
	return nil
}

// Kill ends the node with SIGKILL, as a crash does, and waits for it.
func (n *Node) Kill() {
	n.signal(syscall.SIGKILL)
	n.wait(10 * time.Second)
}

// Terminate sends SIGTERM, as an orderly shutdown or an upgrade does, and
// waits up to timeout for the controlled shutdown to finish.
func (n *Node) Terminate(timeout time.Duration) error {
	if !n.signal(syscall.SIGTERM) {
		return nil
	}
	if !n.wait(timeout) {
		n.Kill()
		return fmt.Errorf("node %d did not stop within %s after SIGTERM; killed", n.ID, timeout)
	}
	return nil
}

// Pause stops the node with SIGSTOP: it holds its connections and answers
// nothing, as a process stuck in a long GC pause or a frozen VM does.
func (n *Node) Pause() {
	if n.signal(syscall.SIGSTOP) {
		n.mu.Lock()
		n.paused = true
		n.mu.Unlock()
	}
}

// Paused reports whether the node is stopped with SIGSTOP.
func (n *Node) Paused() bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.paused && n.cmd != nil && !isClosed(n.exited)
}

// Resume continues a paused node with SIGCONT.
func (n *Node) Resume() {
	if n.signal(syscall.SIGCONT) {
		n.mu.Lock()
		n.paused = false
		n.mu.Unlock()
	}
}

func (n *Node) signal(sig syscall.Signal) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.cmd == nil || n.cmd.Process == nil || isClosed(n.exited) {
		return false
	}
	if n.paused && sig != syscall.SIGCONT && sig != syscall.SIGKILL {
		// A stopped process does not act on SIGTERM until it continues.
		_ = n.cmd.Process.Signal(syscall.SIGCONT)
		n.paused = false
	}
	return n.cmd.Process.Signal(sig) == nil
}

// wait waits up to timeout for the process to exit; it reports whether it
// did.
func (n *Node) wait(timeout time.Duration) bool {
	n.mu.Lock()
	exited := n.exited
	n.mu.Unlock()
	if exited == nil {
		return true
	}
	select {
	case <-exited:
		return true
	case <-time.After(timeout):
		return false
	}
}

// LogTail returns the last lines of the node's server.log and stdout.log.
func (n *Node) LogTail(lines int) string {
	var b strings.Builder
	for _, name := range []string{"server.log", "stdout.log"} {
		tail, err := tailFile(filepath.Join(n.dir, name), lines)
		if err != nil {
			continue
		}
		if tail != "" {
			fmt.Fprintf(&b, "[%s]\n%s", name, tail)
		}
	}
	return b.String()
}

// tailFile returns the last lines of path, reading at most its last 64 KiB.
func tailFile(path string, lines int) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	const window = 64 << 10
	if st, err := f.Stat(); err == nil && st.Size() > window {
		if _, err := f.Seek(st.Size()-window, io.SeekStart); err != nil {
			return "", err
		}
	}
	b, err := io.ReadAll(f)
	if err != nil && !errors.Is(err, io.EOF) {
		return "", err
	}
	all := bytes.Split(bytes.TrimRight(b, "\n"), []byte("\n"))
	if len(all) > lines {
		all = all[len(all)-lines:]
	}
	return string(bytes.Join(all, []byte("\n"))) + "\n", nil
}

func isClosed(ch chan struct{}) bool {
	if ch == nil {
		return false
	}
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

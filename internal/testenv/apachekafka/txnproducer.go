package apachekafka

import (
	"bufio"
	"context"
	"crypto/sha256"
	_ "embed"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// txnProducerSource is an order service's transactional producer, written
// with Apache Kafka's own Java client (kafka-clients).
//
//go:embed java/TxnProducer.java
var txnProducerSource []byte

// TxnProducer is a Java process that writes records in Kafka transactions
// through kafka-clients, as Spring Kafka or a plain Java service does,
// driven by the methods below: billing's tests use it as the producer of
// the order topic whose transactions commit, abort, or are left open when
// it is killed.
type TxnProducer struct {
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	answer *bufio.Scanner
	exited chan struct{}

	mu sync.Mutex // one command at a time
}

// StartTxnProducer compiles the producer (once per source, in the cache
// directory) and starts it against bootstrap (comma-separated) with the
// given transactional.id and transaction.timeout.ms; its client's log goes
// to logPath. It returns once the producer holds its transactional id.
func StartTxnProducer(ctx context.Context, bootstrap, transactionalID string, txnTimeout time.Duration, logPath string) (*TxnProducer, error) {
	classes, classpath, err := compileTxnProducer(ctx)
	if err != nil {
		return nil, err
	}
	java, err := Java()
	if err != nil {
		return nil, err
	}
	logFile, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	// The JVM's temporary files (the compression codecs' native libraries
	// unpacked there) go with the process.
	tmp, err := os.MkdirTemp("", "billing-txnproducer-")
	if err != nil {
		logFile.Close()
		return nil, err
	}
	cmd := exec.Command(java, "-Xmx128m", "-Djava.io.tmpdir="+tmp, "-cp", classes+string(os.PathListSeparator)+classpath, "TxnProducer",
		bootstrap, transactionalID, strconv.FormatInt(txnTimeout.Milliseconds(), 10))
	cmd.Stderr = logFile
	// Killed with the test, whatever ends it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	cleanup := func() {
		logFile.Close()
		os.RemoveAll(tmp)
	}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		cleanup()
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		cleanup()
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		cleanup()
		return nil, fmt.Errorf("start the Java transactional producer: %w", err)
	}
	p := &TxnProducer{cmd: cmd, stdin: stdin, answer: bufio.NewScanner(stdout), exited: make(chan struct{})}
	go func() {
		_ = cmd.Wait()
		cleanup()
		close(p.exited)
	}()
	ready := make(chan error, 1)
	go func() { ready <- p.read("ready") }()
	select {
	case err = <-ready:
	case <-ctx.Done():
		err = ctx.Err()
	}
	if err != nil {
		p.Kill()
		return nil, fmt.Errorf("Java transactional producer %s: %w (log: %s)", transactionalID, err, logPath)
	}
	return p, nil
}

// compileTxnProducer compiles the embedded source against the pinned
// kafka-clients jar into the cache directory, unless an earlier run did,
// and returns the class directory and the client's classpath.
func compileTxnProducer(ctx context.Context) (classes, classpath string, err error) {
	libs, err := PinnedJars(ctx)
	if err != nil {
		return "", "", err
	}
	// kafka-clients and what it loads: compression codecs, and the logging
	// facade with no binding (its records are dropped).
	var jars []string
	for _, pattern := range []string{"kafka-clients-*.jar", "slf4j-api-*.jar", "zstd-jni-*.jar", "lz4-java-*.jar", "snappy-java-*.jar"} {
		m, err := filepath.Glob(filepath.Join(libs, pattern))
		if err != nil || len(m) == 0 {
			return "", "", fmt.Errorf("no %s in %s", pattern, libs)
		}
		jars = append(jars, m...)
	}
	classpath = strings.Join(jars, string(os.PathListSeparator))
	cache, err := DefaultCacheDir()
	if err != nil {
		return "", "", err
	}
	sum := sha256.Sum256(append(append([]byte{}, txnProducerSource...), libs...))
	classes = filepath.Join(cache, "txnproducer-"+hex.EncodeToString(sum[:6]))
	if _, err := os.Stat(filepath.Join(classes, "TxnProducer.class")); err == nil {
		return classes, classpath, nil
	}
	java, err := Java()
	if err != nil {
		return "", "", err
	}
	javac := filepath.Join(filepath.Dir(java), "javac")
	if _, err := os.Stat(javac); err != nil {
		if javac, err = exec.LookPath("javac"); err != nil {
			return "", "", errors.New("javac (a JDK 17 or newer) is not next to java nor on PATH")
		}
	}
	// Compiled aside and renamed into place: concurrent test binaries may
	// compile it at the same time.
	tmp, err := os.MkdirTemp(cache, "txnproducer-build-")
	if err != nil {
		return "", "", err
	}
	defer os.RemoveAll(tmp)
	src := filepath.Join(tmp, "TxnProducer.java")
	if err := os.WriteFile(src, txnProducerSource, 0o644); err != nil {
		return "", "", err
	}
	out, err := exec.CommandContext(ctx, javac, "-cp", classpath, "-d", filepath.Join(tmp, "classes"), src).CombinedOutput()
	if err != nil {
		return "", "", fmt.Errorf("javac TxnProducer.java: %w\n%s", err, out)
	}
	if err := os.Rename(filepath.Join(tmp, "classes"), classes); err != nil && !errors.Is(err, os.ErrExist) {
		if _, statErr := os.Stat(filepath.Join(classes, "TxnProducer.class")); statErr != nil {
			return "", "", err
		}
	}
	return classes, classpath, nil
}

// Begin begins a transaction.
func (p *TxnProducer) Begin() error {
	_, err := p.do("begin")
	return err
}

// Send sends a record to partition of topic in the open transaction, without
// waiting for it; an empty key or value is sent as null.
func (p *TxnProducer) Send(topic string, partition int32, key, value []byte) error {
	_, err := p.do(fmt.Sprintf("send %s %d %s %s", topic, partition, hexOrDash(key), hexOrDash(value)))
	return err
}

// Flush waits until the records sent are written (still uncommitted) and
// returns their offsets, in the order sent.
func (p *TxnProducer) Flush() ([]int64, error) { return p.offsets("flush") }

// Commit commits the transaction and returns the offsets of the records
// sent since the last Flush or Commit.
func (p *TxnProducer) Commit() ([]int64, error) { return p.offsets("commit") }

// Abort aborts the transaction.
func (p *TxnProducer) Abort() error {
	_, err := p.do("abort")
	return err
}

// Pid is the producer's process id.
func (p *TxnProducer) Pid() int { return p.cmd.Process.Pid }

// Kill ends the process with SIGKILL, leaving an open transaction open, and
// waits for it to exit.
func (p *TxnProducer) Kill() {
	_ = p.cmd.Process.Kill()
	<-p.exited
}

// Close closes the producer (an open transaction is aborted by its close)
// and waits for the process to exit, killing it after 10 s.
func (p *TxnProducer) Close() {
	_ = p.stdin.Close()
	select {
	case <-p.exited:
	case <-time.After(10 * time.Second):
		p.Kill()
	}
}

func (p *TxnProducer) offsets(cmd string) ([]int64, error) {
	fields, err := p.do(cmd)
	if err != nil {
		return nil, err
	}
	out := make([]int64, len(fields))
	for i, f := range fields {
		if out[i], err = strconv.ParseInt(f, 10, 64); err != nil {
			return nil, fmt.Errorf("%s: offset %q: %w", cmd, f, err)
		}
	}
	return out, nil
}

// do sends one command and returns the fields of its "ok" answer.
func (p *TxnProducer) do(cmd string) ([]string, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if _, err := io.WriteString(p.stdin, cmd+"\n"); err != nil {
		return nil, fmt.Errorf("%s: %w", strings.Fields(cmd)[0], err)
	}
	if !p.answer.Scan() {
		return nil, fmt.Errorf("%s: the producer exited", strings.Fields(cmd)[0])
	}
	line := p.answer.Text()
	if rest, ok := strings.CutPrefix(line, "ok"); ok {
		return strings.Fields(rest), nil
	}
	return nil, fmt.Errorf("%s: %s", strings.Fields(cmd)[0], strings.TrimPrefix(line, "error "))
}

// read waits for the line want.
func (p *TxnProducer) read(want string) error {
	if !p.answer.Scan() {
		return errors.New("exited before it was ready")
	}
	if got := p.answer.Text(); got != want {
		return fmt.Errorf("said %q, not %q", got, want)
	}
	return nil
}

func hexOrDash(b []byte) string {
	if len(b) == 0 {
		return "-"
	}
	return hex.EncodeToString(b)
}

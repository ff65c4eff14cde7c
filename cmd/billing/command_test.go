package main

import (
	"context"
	"regexp"
	"testing"
	"time"
)

// command is a `billing <args>` running in-process in the background, as a
// terminal would run it until Ctrl-C.
type command struct {
	cancel context.CancelFunc
	done   chan error
	stdout *syncBuffer
	stderr *syncBuffer
}

// startCommand runs billing with args and environ until the test ends or
// stop is called.
func startCommand(t *testing.T, environ map[string]string, args ...string) *command {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	c := &command{cancel: cancel, done: make(chan error, 1), stdout: &syncBuffer{}, stderr: &syncBuffer{}}
	go func() { c.done <- run(ctx, append([]string{"billing"}, args...), environ, nil, c.stdout, c.stderr) }()
	t.Cleanup(func() {
		cancel()
		select {
		case <-c.done:
		case <-time.After(30 * time.Second):
			t.Errorf("billing %v did not stop within 30s", args)
		}
	})
	return c
}

// waitOutput polls stdout until re matches and returns its first group (or
// the whole match), failing the test after timeout or when the command
// exits first.
func (c *command) waitOutput(t *testing.T, re *regexp.Regexp, timeout time.Duration) string {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		if m := re.FindStringSubmatch(c.stdout.String()); m != nil {
			return m[len(m)-1]
		}
		select {
		case err := <-c.done:
			c.done <- err
			t.Fatalf("command exited (%v) before printing %s\nstdout:\n%s\nstderr:\n%s", err, re, c.stdout.String(), c.stderr.String())
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("no %s on stdout within %s\nstdout:\n%s\nstderr:\n%s", re, timeout, c.stdout.String(), c.stderr.String())
		}
	}
}

// stop cancels the command, as SIGTERM would, and returns its error.
func (c *command) stop(t *testing.T) error {
	t.Helper()
	c.cancel()
	select {
	case err := <-c.done:
		c.done <- err // for the cleanup
		return err
	case <-time.After(30 * time.Second):
		t.Fatal("command did not stop within 30s of cancel")
		return nil
	}
}

// Command withpg runs a command with a PostgreSQL server for the tests; make
// test runs go test under it. Where a server answers at TEST_DATABASE_URL
// (by default 127.0.0.1:5432) the command runs as it would without withpg.
// Where none does, withpg starts one (pgserver: the local binaries, else
// the embedded PostgreSQL), names it in the command's TEST_DATABASE_URL and
// stops it when the command exits: one server for all the test binaries of
// a run, which go test runs in parallel, rather than one each.
//
//	go run ./internal/dev/pgserver/cmd/withpg go test ./...
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"syscall"

	"example.com/billing/internal/dev/pgserver"
)

func main() {
	code, err := run(os.Args[1:], os.Getenv, os.Stderr)
	if err != nil {
		fmt.Fprintf(os.Stderr, "withpg: %v\n", err)
	}
	os.Exit(code)
}

// run runs args and returns its exit code.
func run(args []string, getenv func(string) string, stderr io.Writer) (int, error) {
	if len(args) == 0 {
		return 2, errors.New("usage: withpg command [argument...]")
	}
	// Ctrl-C reaches the command from the terminal as well: withpg stops
	// only its own start, and otherwise passes signals on and waits for the
	// command, so that it stops the server after it.
	signals := make(chan os.Signal, 1)
	signal.Notify(signals, os.Interrupt, syscall.SIGTERM)
	defer signal.Stop(signals)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cmd := exec.Command(args[0], args[1:]...)
	started := make(chan struct{})
	go func() {
		select {
		case <-signals:
			cancel() // the command has not started: stop the server's start
			return
		case <-started:
		}
		for sig := range signals {
			_ = cmd.Process.Signal(sig)
		}
	}()

	s, err := pgserver.Ensure(ctx, pgserver.TestOptions(getenv))
	if err != nil {
		return 1, err
	}
	defer func() {
		if err := s.Close(); err != nil {
			fmt.Fprintf(stderr, "withpg: %v\n", err)
		}
	}()
	fmt.Fprintf(stderr, "withpg: PostgreSQL for the tests: %s\n", s.Describe())
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	cmd.Env = append(os.Environ(), "TEST_DATABASE_URL="+s.URL)
	if err := cmd.Start(); err != nil {
		return 1, err
	}
	close(started)
	err = cmd.Wait()
	var exit *exec.ExitError
	switch {
	case err == nil:
		return 0, nil
	case errors.As(err, &exit) && exit.ExitCode() > 0:
		return exit.ExitCode(), nil
	}
	return 1, err
}

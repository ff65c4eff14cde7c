// Command billing charges confirmed orders exactly once in effect. See
// `billing help` for its subcommands, registered in run.go. Built with the
// tag dev (make dev), it also has the developer commands, the demo and the
// fakes it runs (dev.go); the build that ships has none of them.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"example.com/billing/internal/config"
)

func main() {
	// Kubernetes stops a pod with SIGTERM, a terminal with SIGINT: both drain.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	go func() { <-ctx.Done(); stop() }() // a second signal kills at once
	if err := run(ctx, os.Args, config.Environ(), os.Stdin, os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "billing:", err)
		// A command may say more than "failed": reconcile exits 2 when the
		// books differ, so that a CronJob can tell that from an error.
		code := 1
		var ec interface{ ExitCode() int }
		if errors.As(err, &ec) {
			code = ec.ExitCode()
		}
		os.Exit(code)
	}
}

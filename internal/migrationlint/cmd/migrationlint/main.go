// Command migrationlint checks billing's migrations: billing's own rules
// and squawk's, less the exceptions recorded in lint-exceptions.md. `make
// lint-migrations` runs it; see docs/deployment.md, "Migrations while
// billing runs".
//
//	go run ./internal/migrationlint/cmd/migrationlint -squawk PATH -squawk-version V [-table] [dir]
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"

	"example.com/billing/internal/migrationlint"
)

func main() {
	if err := run(context.Background(), os.Args[1:], os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "migrationlint:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fl := flag.NewFlagSet("migrationlint", flag.ContinueOnError)
	fl.SetOutput(stderr)
	squawkPath := fl.String("squawk", "", "the squawk binary; empty: billing's rules only")
	squawkVersion := fl.String("squawk-version", "", "the squawk version billing pins (Makefile SQUAWK_VERSION); another one is refused")
	squawkConfig := fl.String("squawk-config", ".squawk.toml", "squawk's configuration")
	table := fl.Bool("table", false, "print the violations as rows for "+migrationlint.ExceptionsFile+" (their reason left to write)")
	if err := fl.Parse(args); err != nil {
		return err
	}
	dir := "db/migrations"
	if fl.NArg() > 0 {
		dir = fl.Arg(0)
	}

	var squawk *migrationlint.Squawk
	var missing error
	if *squawkPath != "" {
		squawk = &migrationlint.Squawk{Path: *squawkPath, Config: *squawkConfig}
		if _, err := os.Stat(*squawkPath); errors.Is(err, fs.ErrNotExist) {
			// billing's rules still run, so that a machine without
			// squawk sees them; the run fails all the same.
			missing = fmt.Errorf("squawk %s is not installed at %s: `make squawk` installs it (pip install squawk-cli==%s from PyPI, into ~/.cache/billing; needs python3 with pip), or run with SQUAWK=<path of squawk %s>",
				*squawkVersion, *squawkPath, *squawkVersion, *squawkVersion)
			squawk = nil
		} else {
			v, err := squawk.Version(ctx)
			if err != nil {
				return err
			}
			if v != *squawkVersion {
				return fmt.Errorf("%s is squawk %s; billing pins %s (its rules change between versions): `make squawk` installs it", *squawkPath, v, *squawkVersion)
			}
		}
	}

	report, err := migrationlint.Lint(ctx, os.DirFS(dir), squawk)
	if err != nil {
		return err
	}
	if *table {
		for _, v := range report.Violations {
			fmt.Fprintf(stdout, "| %s | %d | `%s` | %s | |\n", v.File, v.Statement, v.Excerpt, v.Rule)
		}
		return nil
	}
	for _, v := range report.Violations {
		fmt.Fprintf(stdout, "%s/%s\n", dir, v)
	}
	for _, e := range report.Stale {
		fmt.Fprintf(stdout, "%s/%s:%d: the exception for %s statement %d (%s) matches no violation: remove it\n", dir, migrationlint.ExceptionsFile, e.Line, e.File, e.Statement, e.Rule)
	}
	with := "billing's rules"
	if squawk != nil {
		with += " and squawk " + *squawkVersion
	}
	fmt.Fprintf(stdout, "migrationlint: %d migrations, %d Up statements, %s: %d violations, %d stale exceptions, %d accepted by %s\n",
		report.Files, report.Statements, with, len(report.Violations), len(report.Stale), report.Excused, migrationlint.ExceptionsFile)
	if missing != nil {
		return missing
	}
	if !report.OK() {
		return fmt.Errorf("%d violations, %d stale exceptions: fix the migration, or record why it is accepted in %s/%s (docs/deployment.md, \"Migrations while billing runs\")",
			len(report.Violations), len(report.Stale), dir, migrationlint.ExceptionsFile)
	}
	return nil
}

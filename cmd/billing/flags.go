package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
)

// newFlagSet returns the flag set of `billing <name>`, whose -h prints
// synopsis, description and the flags.
func newFlagSet(name, synopsis, description string) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.Usage = func() {
		w := fs.Output()
		fmt.Fprintf(w, "Usage: billing %s %s\n\n%s\n", name, synopsis, strings.TrimSpace(description))
		fmt.Fprintln(w, "\nFlags:")
		fs.PrintDefaults()
	}
	return fs
}

// parseSubcommandFlags parses args into fs. It reports help=true when -h
// was asked for, after printing the help to stdout; a bad flag is returned
// as an error naming the command, for main to print once.
func parseSubcommandFlags(fs *flag.FlagSet, args []string, stdout io.Writer) (help bool, err error) {
	fs.SetOutput(io.Discard)
	err = fs.Parse(args)
	if errors.Is(err, flag.ErrHelp) {
		fs.SetOutput(stdout)
		fs.Usage()
		return true, nil
	}
	if err != nil {
		return false, fmt.Errorf("%s: %w (see billing %s -h)", fs.Name(), err, fs.Name())
	}
	if fs.NArg() > 0 {
		return false, fmt.Errorf("%s takes no arguments, got %s", fs.Name(), strings.Join(fs.Args(), " "))
	}
	return false, nil
}

package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"

	"example.com/billing/internal/config"
)

// about is what `billing <command> -h` says about a command besides its
// flags.
type about struct {
	synopsis    string // after "billing <command>", e.g. "[flags]"
	description string
	// env is the configuration the command loads from the environment (a
	// pointer to its struct), nil when it reads none. Its variables are
	// listed from the struct tags, so that the help cannot drift from what
	// the command reads.
	env     any
	example string
}

// newFlagSet returns the flag set of `billing <name>`, whose -h prints the
// synopsis, the description, the flags, the environment variables with
// their defaults and meaning, and an example.
func newFlagSet(name string, h about) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.Usage = func() {
		w := fs.Output()
		fmt.Fprintf(w, "Usage: billing %s\n\n%s\n", strings.TrimSpace(name+" "+h.synopsis), strings.TrimSpace(h.description))
		hasFlags := false
		fs.VisitAll(func(*flag.Flag) { hasFlags = true })
		if hasFlags {
			fmt.Fprintln(w, "\nFlags:")
			fs.PrintDefaults()
		}
		if h.env != nil {
			printEnv(w, h.env)
		}
		if h.example != "" {
			fmt.Fprintf(w, "\nExample:\n  %s\n", strings.TrimSpace(h.example))
		}
	}
	return fs
}

// printEnv lists the variables of the configuration cfg in flag.PrintDefaults'
// layout: NAME=default (or "(required)"), then the meaning.
func printEnv(w io.Writer, cfg any) {
	fmt.Fprintln(w, "\nEnvironment (NAME=default):")
	for _, v := range config.Vars(cfg) {
		switch {
		case v.Required:
			fmt.Fprintf(w, "  %s (required)\n", v.Name)
		case v.Default != "":
			fmt.Fprintf(w, "  %s=%s\n", v.Name, v.Default)
		default:
			fmt.Fprintf(w, "  %s\n", v.Name)
		}
		fmt.Fprintf(w, "    \t%s\n", v.Help)
	}
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
		return false, fmt.Errorf("%s takes no arguments, got %s (see billing %s -h)", fs.Name(), strings.Join(fs.Args(), " "), fs.Name())
	}
	return false, nil
}

// parseWithArgument parses args into fs for a command that takes one
// argument (billing explain <id>), before or among its flags: Go's flag
// package stops at the first argument, so what follows it is parsed too.
// It reports help=true when -h was asked for, after printing the help.
func parseWithArgument(fs *flag.FlagSet, args []string, stdout io.Writer) (arg string, help bool, err error) {
	fs.SetOutput(io.Discard)
	err = fs.Parse(args)
	if err == nil && fs.NArg() > 0 {
		arg = fs.Arg(0)
		err = fs.Parse(fs.Args()[1:])
	}
	if errors.Is(err, flag.ErrHelp) {
		fs.SetOutput(stdout)
		fs.Usage()
		return "", true, nil
	}
	switch {
	case err != nil:
		return "", false, fmt.Errorf("%s: %w (see billing %s -h)", fs.Name(), err, fs.Name())
	case arg == "":
		return "", false, fmt.Errorf("%s: an argument is required (see billing %s -h)", fs.Name(), fs.Name())
	case fs.NArg() > 0:
		return "", false, fmt.Errorf("%s takes one argument, got also %s (see billing %s -h)", fs.Name(), strings.Join(fs.Args(), " "), fs.Name())
	}
	return arg, false, nil
}

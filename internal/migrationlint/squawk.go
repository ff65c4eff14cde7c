package migrationlint

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// SquawkPrefix marks squawk's rules in reports and in ExceptionsFile,
// apart from billing's own.
const SquawkPrefix = "squawk:"

// Squawk runs the squawk linter (squawkhq.com) over migrations' Up
// sections.
type Squawk struct {
	// Path is the squawk binary.
	Path string
	// Config is the .squawk.toml with the rules billing turns off and why.
	Config string
}

// Version returns the version squawk reports, e.g. "2.70.0".
func (s Squawk) Version(ctx context.Context) (string, error) {
	out, err := exec.CommandContext(ctx, s.Path, "--version").Output()
	if err != nil {
		return "", fmt.Errorf("%s --version: %w", s.Path, err)
	}
	fields := strings.Fields(string(out))
	if len(fields) != 2 || fields[0] != "squawk" {
		return "", fmt.Errorf("%s --version printed %q, not squawk's version", s.Path, out)
	}
	return fields[1], nil
}

// squawkViolation is one element of squawk's --reporter json output.
type squawkViolation struct {
	File    string `json:"file"`
	Line    int    `json:"line"` // 0-based
	Rule    string `json:"rule_name"`
	Message string `json:"message"`
	Help    string `json:"help"`
}

// Check runs squawk over the Up sections of files and returns its findings
// as violations of the statements they fall in.
//
// squawk reads whole files and knows nothing of goose, so it is given a
// copy of each migration with everything after the Up section blanked out
// (line numbers stay the file's), and is told per file whether goose wraps
// it in a transaction: squawk then rightly reports CONCURRENTLY in a
// transaction, and asks for IF [NOT] EXISTS (prefer-robust-stmts) only
// where a failed run leaves half a migration applied.
func (s Squawk) Check(ctx context.Context, files []File) ([]Violation, error) {
	dir, err := os.MkdirTemp("", "migrationlint")
	if err != nil {
		return nil, fmt.Errorf("squawk: %w", err)
	}
	defer os.RemoveAll(dir)
	config, err := filepath.Abs(s.Config)
	if err != nil {
		return nil, fmt.Errorf("squawk config: %w", err)
	}
	byName := map[string]File{}
	var inTx, noTx []string
	for _, f := range files {
		if err := os.WriteFile(filepath.Join(dir, f.Name), upSection(f), 0o600); err != nil {
			return nil, fmt.Errorf("squawk: %w", err)
		}
		byName[f.Name] = f
		if f.NoTransaction {
			noTx = append(noTx, f.Name)
		} else {
			inTx = append(inTx, f.Name)
		}
	}
	var out []Violation
	for _, run := range []struct {
		flag  string
		names []string
	}{{"--assume-in-transaction", inTx}, {"--no-assume-in-transaction", noTx}} {
		if len(run.names) == 0 {
			continue
		}
		found, err := s.run(ctx, dir, config, run.flag, run.names)
		if err != nil {
			return nil, err
		}
		for _, v := range found {
			f, ok := byName[v.File]
			if !ok {
				return nil, fmt.Errorf("squawk reported a file it was not given: %q", v.File)
			}
			msg := v.Message
			if v.Help != "" {
				msg += " (" + v.Help + ")"
			}
			index := statementAt(f, v.Line+1)
			var begins string
			if index > 0 {
				begins = excerpt(f.Up[index-1].SQL)
			}
			out = append(out, Violation{File: f.Name, Statement: index, Line: v.Line + 1, Rule: SquawkPrefix + v.Rule, Message: msg, Excerpt: begins})
		}
	}
	return out, nil
}

// run runs squawk once, in dir, over names.
func (s Squawk) run(ctx context.Context, dir, config, txFlag string, names []string) ([]squawkViolation, error) {
	args := append([]string{"--config", config, "--reporter", "json", txFlag}, names...)
	cmd := exec.CommandContext(ctx, s.Path, args...)
	cmd.Dir = dir
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	// squawk exits 1 when it found something; anything else is a failure
	// to run.
	var exit *exec.ExitError
	if err != nil && !(errors.As(err, &exit) && exit.ExitCode() == 1) {
		return nil, fmt.Errorf("squawk %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	var found []squawkViolation
	if err := json.Unmarshal(stdout.Bytes(), &found); err != nil {
		return nil, fmt.Errorf("squawk's report: %w (stdout %q, stderr %q)", err, stdout.String(), stderr.String())
	}
	if err != nil && len(found) == 0 {
		return nil, fmt.Errorf("squawk exited 1 and reported nothing: %s", strings.TrimSpace(stderr.String()))
	}
	return found, nil
}

// upSection returns f with every line after its Up section blank, so that
// squawk's line numbers are the file's.
func upSection(f File) []byte {
	lines := strings.Split(string(f.Source), "\n")
	for i := f.UpEnd; i < len(lines); i++ {
		lines[i] = ""
	}
	return []byte(strings.Join(lines, "\n"))
}

// statementAt returns the Index of the Up statement that holds line (or
// the first one after it, for a finding on a comment line); 0 if none.
func statementAt(f File, line int) int {
	for _, s := range f.Up {
		if line <= s.EndLine {
			return s.Index
		}
	}
	return 0
}

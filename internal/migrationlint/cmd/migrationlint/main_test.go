package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// writeMigrations makes a migrations directory: one migration that breaks
// lock-timeout, accepted by an exception, unless bad adds one that is not.
func writeMigrations(t *testing.T, bad bool) string {
	t.Helper()
	dir := t.TempDir()
	files := map[string]string{
		"00001_a.sql": "-- +goose Up\nCREATE TABLE charge (id bigint);\n",
		"00002_b.sql": "-- +goose Up\nALTER TABLE charge ADD COLUMN note text;\n",
		"lint-exceptions.md": "| migration | statement | begins with | rule | reason |\n| --- | --- | --- | --- | --- |\n" +
			"| 00002_b.sql | 1 | `ALTER TABLE charge` | lock-timeout | released before the rule |\n",
	}
	if bad {
		files["00003_c.sql"] = "-- +goose Up\nALTER TABLE charge ALTER COLUMN id TYPE numeric;\n"
	}
	for name, src := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(src), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func TestRun_OK(t *testing.T) {
	var out bytes.Buffer
	if err := run(context.Background(), []string{writeMigrations(t, false)}, &out, &out); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	if !strings.Contains(out.String(), "2 migrations, 2 Up statements, billing's rules: 0 violations, 0 stale exceptions, 1 accepted") {
		t.Errorf("summary:\n%s", out.String())
	}
}

func TestRun_ErrViolation(t *testing.T) {
	var out bytes.Buffer
	err := run(context.Background(), []string{writeMigrations(t, true)}, &out, &out)
	if err == nil || !strings.Contains(err.Error(), "lint-exceptions.md") {
		t.Fatalf("error %v, want one saying where exceptions are recorded", err)
	}
	for _, want := range []string{"00003_c.sql:2: lock-timeout (statement 1)", "00003_c.sql:2: no-rewrite (statement 1)"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
}

// Without squawk, billing's rules still run and report; then the run
// fails, saying how to install it.
func TestRun_ErrSquawkMissing(t *testing.T) {
	var out bytes.Buffer
	missing := filepath.Join(t.TempDir(), "squawk")
	err := run(context.Background(), []string{"-squawk", missing, "-squawk-version", "2.70.0", writeMigrations(t, true)}, &out, &out)
	if err == nil || !strings.Contains(err.Error(), "make squawk") || !strings.Contains(err.Error(), "squawk-cli==2.70.0") {
		t.Fatalf("error %v, want one naming make squawk and the pinned package", err)
	}
	if !strings.Contains(out.String(), "no-rewrite") {
		t.Errorf("billing's rules did not run:\n%s", out.String())
	}
}

func TestRun_ErrOtherSquawkVersion(t *testing.T) {
	squawk := filepath.Join(t.TempDir(), "squawk")
	if err := os.WriteFile(squawk, []byte("#!/bin/sh\necho squawk 2.66.0\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	err := run(context.Background(), []string{"-squawk", squawk, "-squawk-version", "2.70.0", writeMigrations(t, false)}, &out, &out)
	if err == nil || !strings.Contains(err.Error(), "squawk 2.66.0; billing pins 2.70.0") {
		t.Fatalf("error %v, want the version mismatch", err)
	}
}

// Package migrationlint checks billing's goose migrations against the rules
// a migration must follow while replicas of the previous release are still
// charging (docs/deployment.md, "Migrations while billing runs"): a
// lock_timeout before every DDL on a hot table, indexes built CONCURRENTLY,
// constraints added NOT VALID and validated later, no rewrite of a hot
// table. It also runs squawk over the same Up sections and reads the
// exceptions recorded for migrations released before the rules.
//
// It is a statement classifier, not a SQL parser: it tokenizes each
// statement and recognises the few shapes the rules are about. What it does
// not recognise it leaves alone, and squawk, which does parse SQL, looks at
// every statement as well.
package migrationlint

import (
	"bufio"
	"bytes"
	"fmt"
	"strings"
)

// File is one goose migration: its Up section split into statements the way
// goose splits it.
type File struct {
	Name string
	// Source is the whole file, kept for squawk.
	Source []byte
	// NoTransaction is goose's `-- +goose NO TRANSACTION`: each statement
	// then commits on its own; otherwise the whole Up section is one
	// transaction.
	NoTransaction bool
	Up            []Statement
	// UpEnd is the last line of the Up section (the line before
	// `-- +goose Down`, or the file's last line).
	UpEnd int
}

// Statement is one statement of an Up section, as goose sends it to the
// server.
type Statement struct {
	// Index counts the Up section's statements from 1; lint-exceptions.md
	// names statements by it.
	Index int
	// Line and EndLine are the 1-based lines of the file it spans.
	Line, EndLine int
	SQL           string
}

// ParseFile splits a goose SQL migration into its Up statements. It follows
// goose v3's parser (internal/sqlparser, which goose does not export): a
// statement ends on a line whose last word before any `--` ends with `;`,
// except between `-- +goose StatementBegin` and `-- +goose StatementEnd`;
// comment and blank lines before a statement are not part of it.
func ParseFile(name string, src []byte) (File, error) {
	f := File{Name: name, Source: src}
	const (
		start = iota
		up
		upBlock
		down
	)
	state := start
	var buf strings.Builder
	first := 0 // the line the statement in buf started on
	lineNo := 0
	emit := func(end int) {
		f.Up = append(f.Up, Statement{Index: len(f.Up) + 1, Line: first, EndLine: end, SQL: strings.TrimSpace(buf.String())})
		buf.Reset()
	}
	sc := bufio.NewScanner(bytes.NewReader(src))
	sc.Buffer(nil, 4<<20)
	for sc.Scan() {
		line := sc.Text()
		lineNo++
		trimmed := strings.TrimSpace(line)
		if strings.HasPrefix(trimmed, "--") && strings.Contains(line, "+goose") {
			annotation := strings.TrimSpace(strings.Replace(strings.ReplaceAll(line, "--", ""), "+goose", "", 1))
			switch strings.ToUpper(annotation) {
			case "UP":
				if state != start {
					return File{}, fmt.Errorf("%s:%d: a second -- +goose Up", name, lineNo)
				}
				state = up
			case "DOWN":
				if state != up {
					return File{}, fmt.Errorf("%s:%d: -- +goose Down outside the Up section's end", name, lineNo)
				}
				if strings.TrimSpace(buf.String()) != "" {
					return File{}, fmt.Errorf("%s:%d: the Up section ends inside a statement (missing semicolon?)", name, lineNo)
				}
				f.UpEnd = lineNo - 1
				state = down
			case "STATEMENTBEGIN":
				if state == up {
					state = upBlock
				}
			case "STATEMENTEND":
				if state == upBlock {
					if buf.Len() > 0 {
						emit(lineNo - 1)
					}
					state = up
				}
			case "NO TRANSACTION":
				f.NoTransaction = true
			case "ENVSUB ON", "ENVSUB OFF":
				// Substitution changes values, not the statements' shape.
			default:
				return File{}, fmt.Errorf("%s:%d: unknown goose annotation %q", name, lineNo, annotation)
			}
			continue
		}
		if state != up && state != upBlock {
			continue
		}
		if buf.Len() == 0 {
			if trimmed == "" || strings.HasPrefix(trimmed, "--") {
				continue
			}
			first = lineNo
		}
		buf.WriteString(line)
		buf.WriteByte('\n')
		if state == up && endsWithSemicolon(line) {
			emit(lineNo)
		}
	}
	if err := sc.Err(); err != nil {
		return File{}, fmt.Errorf("read %s: %w", name, err)
	}
	switch state {
	case start:
		return File{}, fmt.Errorf("%s: no -- +goose Up annotation", name)
	case upBlock:
		return File{}, fmt.Errorf("%s: -- +goose StatementBegin without StatementEnd", name)
	case up:
		if strings.TrimSpace(buf.String()) != "" {
			return File{}, fmt.Errorf("%s: the Up section ends inside a statement (missing semicolon?)", name)
		}
		f.UpEnd = lineNo
	}
	return f, nil
}

// endsWithSemicolon is goose's test for the end of a statement: the last
// word before a `--` word ends with `;`.
func endsWithSemicolon(line string) bool {
	prev := ""
	for _, word := range strings.Fields(line) {
		if strings.HasPrefix(word, "--") {
			break
		}
		prev = word
	}
	return strings.HasSuffix(prev, ";")
}

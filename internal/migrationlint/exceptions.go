package migrationlint

import (
	"fmt"
	"strconv"
	"strings"
)

// ExceptionsFile is the file, beside the migrations, that records the rule
// violations accepted and why: a Markdown table, so that it reads as a
// page, of one row per migration, statement and rule.
const ExceptionsFile = "lint-exceptions.md"

// Exception is one accepted violation.
type Exception struct {
	// Line is the row's line in ExceptionsFile, for messages.
	Line      int
	File      string
	Statement int
	// Begins is how the statement begins, so that an exception cannot
	// silently move to another statement when a file is edited.
	Begins string
	Rule   string
	Reason string
}

// ParseExceptions reads the rows of ExceptionsFile's table: | migration |
// statement | begins with | rule | reason |. Other lines are prose.
func ParseExceptions(src []byte) ([]Exception, error) {
	var out []Exception
	for i, line := range strings.Split(string(src), "\n") {
		line = strings.TrimSpace(line)
		if !strings.HasPrefix(line, "|") {
			continue
		}
		cells := strings.Split(strings.Trim(line, "|"), "|")
		for j := range cells {
			cells[j] = strings.TrimSpace(cells[j])
		}
		if cells[0] == "migration" || strings.Trim(cells[0], "-: ") == "" {
			continue // the header and the line under it
		}
		if len(cells) != 5 {
			return nil, fmt.Errorf("%s:%d: %d cells, want 5 (migration | statement | begins with | rule | reason; no | inside a cell)", ExceptionsFile, i+1, len(cells))
		}
		n, err := strconv.Atoi(cells[1])
		if err != nil || n < 0 {
			return nil, fmt.Errorf("%s:%d: statement %q is not a statement number", ExceptionsFile, i+1, cells[1])
		}
		e := Exception{Line: i + 1, File: cells[0], Statement: n, Begins: strings.Trim(cells[2], "`"), Rule: strings.Trim(cells[3], "`"), Reason: cells[4]}
		if e.Reason == "" {
			return nil, fmt.Errorf("%s:%d: the exception for %s statement %d (%s) gives no reason", ExceptionsFile, i+1, e.File, e.Statement, e.Rule)
		}
		out = append(out, e)
	}
	return out, nil
}

// excuse removes from violations those an exception accepts. It returns
// the rest, how many it excused, and the exceptions nothing matched (a
// statement fixed or gone: the row must go too, so the table stays true).
// An exception whose statement no longer begins as recorded is an error.
func excuse(files []File, violations []Violation, exceptions []Exception) (rest []Violation, excused int, stale []Exception, err error) {
	statements := map[string]map[int]Statement{}
	for _, f := range files {
		statements[f.Name] = map[int]Statement{}
		for _, s := range f.Up {
			statements[f.Name][s.Index] = s
		}
	}
	used := make([]bool, len(exceptions))
	for _, e := range exceptions {
		if e.Statement == 0 {
			continue
		}
		s, ok := statements[e.File][e.Statement]
		if !ok {
			return nil, 0, nil, fmt.Errorf("%s:%d: %s has no Up statement %d", ExceptionsFile, e.Line, e.File, e.Statement)
		}
		if strings.TrimSpace(e.Begins) == "" || !strings.HasPrefix(normalize(s.SQL), normalize(e.Begins)) {
			return nil, 0, nil, fmt.Errorf("%s:%d: statement %d of %s does not begin with %q (it begins %q)", ExceptionsFile, e.Line, e.Statement, e.File, e.Begins, excerpt(s.SQL))
		}
	}
next:
	for _, v := range violations {
		for i, e := range exceptions {
			if e.File == v.File && e.Statement == v.Statement && e.Rule == v.Rule {
				used[i] = true
				excused++
				continue next
			}
		}
		rest = append(rest, v)
	}
	for i, e := range exceptions {
		if !used[i] {
			stale = append(stale, e)
		}
	}
	return rest, excused, stale, nil
}

// normalize makes statement beginnings comparable: comments dropped, white
// space collapsed, lower case.
func normalize(sql string) string {
	return strings.ToLower(flatten(sql))
}

// excerpt is a statement's first words, for messages and the exceptions
// table.
func excerpt(sql string) string {
	n := flatten(sql)
	if len(n) > 60 {
		n = n[:60]
		if i := strings.LastIndexByte(n, ' '); i > 30 {
			n = n[:i]
		}
	}
	return n
}

// flatten drops -- comments and collapses white space.
func flatten(sql string) string {
	var b strings.Builder
	for _, line := range strings.Split(sql, "\n") {
		if i := strings.Index(line, "--"); i >= 0 {
			line = line[:i]
		}
		b.WriteString(line)
		b.WriteByte(' ')
	}
	return strings.Join(strings.Fields(b.String()), " ")
}

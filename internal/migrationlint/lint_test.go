package migrationlint_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"testing/fstest"

	"example.com/billing/internal/migrationlint"
)

const (
	baseFile = "-- +goose Up\nCREATE TABLE charge (event_id uuid PRIMARY KEY, note text);\n"
	// Two statements that break lock-timeout, then a down section that
	// would break everything if it were linted.
	twoAlters = "-- +goose Up\nALTER TABLE charge ADD COLUMN a text;\nALTER TABLE charge ADD COLUMN b text;\n-- +goose Down\nDROP TABLE charge;\n"
	header    = "# Exceptions\n\nProse.\n\n| migration | statement | begins with | rule | reason |\n| --- | --- | --- | --- | --- |\n"
)

func lintFS(t *testing.T, files map[string]string, squawk *migrationlint.Squawk) (migrationlint.Report, error) {
	t.Helper()
	fsys := fstest.MapFS{}
	for name, src := range files {
		fsys[name] = &fstest.MapFile{Data: []byte(src)}
	}
	return migrationlint.Lint(context.Background(), fsys, squawk)
}

func TestLint_ExceptionAcceptsItsStatementAndRuleOnly(t *testing.T) {
	r, err := lintFS(t, map[string]string{
		"00001_base.sql":  baseFile,
		"00002_alter.sql": twoAlters,
		migrationlint.ExceptionsFile: header +
			"| 00002_alter.sql | 1 | `ALTER TABLE charge ADD COLUMN a` | lock-timeout | released before the rule; charge was empty |\n" +
			"| 00002_alter.sql | 1 | `ALTER TABLE charge` | no-rewrite | statement 1 rewrites nothing: a stale row |\n",
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if r.Files != 2 || r.Statements != 3 || r.Excused != 1 {
		t.Errorf("report %+v, want 2 files, 3 statements, 1 excused", r)
	}
	if len(r.Violations) != 1 || r.Violations[0].Statement != 2 || r.Violations[0].Rule != migrationlint.RuleLockTimeout {
		t.Errorf("violations %v, want lock-timeout of statement 2 only", r.Violations)
	}
	if len(r.Stale) != 1 || r.Stale[0].Rule != migrationlint.RuleNoRewrite || r.Stale[0].Line != 8 {
		t.Errorf("stale %+v, want the no-rewrite row (line 8)", r.Stale)
	}
	if r.OK() {
		t.Error("OK with a violation and a stale exception")
	}
}

func TestLint_OKWhenEveryViolationIsAccepted(t *testing.T) {
	r, err := lintFS(t, map[string]string{
		"00001_base.sql":  baseFile,
		"00002_alter.sql": twoAlters,
		migrationlint.ExceptionsFile: header +
			"| 00002_alter.sql | 1 | `alter table charge add column a text;` | lock-timeout | case and white space do not matter |\n" +
			"| 00002_alter.sql | 2 | `ALTER   TABLE charge` | lock-timeout | the same |\n",
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !r.OK() || r.Excused != 2 {
		t.Errorf("report %+v, want OK with 2 excused", r)
	}
}

func TestLint_ExceptionErrors(t *testing.T) {
	for name, row := range map[string]string{
		"ErrNoReason":           "| 00002_alter.sql | 1 | `ALTER TABLE charge` | lock-timeout | |\n",
		"ErrStatementMoved":     "| 00002_alter.sql | 1 | `ALTER TABLE charge ADD COLUMN b` | lock-timeout | b was statement 2 |\n",
		"ErrNoSuchStatement":    "| 00002_alter.sql | 3 | `DROP TABLE charge` | lock-timeout | the Down section is not linted |\n",
		"ErrEmptyBeginning":     "| 00002_alter.sql | 1 | | lock-timeout | which statement? |\n",
		"ErrNotANumber":         "| 00002_alter.sql | one | `ALTER TABLE charge` | lock-timeout | a reason |\n",
		"ErrPipeInsideTheCells": "| 00002_alter.sql | 1 | `ALTER TABLE charge` | lock-timeout | a | b |\n",
	} {
		t.Run(name, func(t *testing.T) {
			r, err := lintFS(t, map[string]string{"00001_base.sql": baseFile, "00002_alter.sql": twoAlters, migrationlint.ExceptionsFile: header + row}, nil)
			if err == nil {
				t.Fatalf("report %+v, want an error", r)
			}
			if !strings.Contains(err.Error(), migrationlint.ExceptionsFile+":7") {
				t.Errorf("error %q does not name the row's line", err)
			}
		})
	}
}

// Without squawk its exceptions are neither used nor stale: billing's
// rules alone pass on a machine without it (make test's check).
func TestLint_SquawkExceptionsWaitForSquawk(t *testing.T) {
	r, err := lintFS(t, map[string]string{
		"00001_base.sql":             baseFile,
		migrationlint.ExceptionsFile: header + "| 00001_base.sql | 1 | `CREATE TABLE charge` | squawk:prefer-text-field | an example |\n",
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !r.OK() {
		t.Errorf("report %+v, want OK", r)
	}
}

// fakeSquawk writes a squawk that records its arguments and the files it
// was given, and reports one finding on line 3 (0-based 2) of
// 00002_alter.sql.
func fakeSquawk(t *testing.T) (migrationlint.Squawk, string) {
	t.Helper()
	dir := t.TempDir()
	log := filepath.Join(dir, "log")
	script := `#!/bin/sh
if [ "$1" = --version ]; then echo "squawk 9.9.9"; exit 0; fi
echo "$*" >> ` + log + `
found=0
for a in "$@"; do
  case "$a" in *.sql) cat "$a" >> ` + log + `.files ;; esac
  [ "$a" = 00002_alter.sql ] && found=1
done
if [ $found = 1 ]; then
  echo '[{"file":"00002_alter.sql","line":2,"column":0,"level":"Warning","message":"Dropping a column may break existing clients.","help":null,"rule_name":"ban-drop-column","column_end":1,"line_end":2}]'
  exit 1
fi
echo '[]'
`
	path := filepath.Join(dir, "squawk")
	if err := os.WriteFile(path, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	config := filepath.Join(dir, ".squawk.toml")
	if err := os.WriteFile(config, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	return migrationlint.Squawk{Path: path, Config: config}, log
}

func TestSquawk_FindingsBecomeViolationsOfTheirStatement(t *testing.T) {
	squawk, log := fakeSquawk(t)
	if v, err := squawk.Version(context.Background()); err != nil || v != "9.9.9" {
		t.Fatalf("version %q, %v", v, err)
	}
	r, err := lintFS(t, map[string]string{
		"00001_base.sql":  baseFile,
		"00002_alter.sql": twoAlters,
		"00003_index.sql": "-- +goose NO TRANSACTION\n-- +goose Up\nCREATE INDEX CONCURRENTLY IF NOT EXISTS charge_note ON charge (note);\n",
		migrationlint.ExceptionsFile: header +
			"| 00002_alter.sql | 1 | `ALTER TABLE charge` | lock-timeout | an example |\n" +
			"| 00002_alter.sql | 2 | `ALTER TABLE charge` | lock-timeout | an example |\n",
	}, &squawk)
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Violations) != 2 {
		t.Fatalf("violations %v, want squawk's ban-drop-column and billing's lock-timeout of 00003", r.Violations)
	}
	v := r.Violations[0]
	if v.File != "00002_alter.sql" || v.Statement != 2 || v.Line != 3 || v.Rule != "squawk:ban-drop-column" || v.Excerpt != "ALTER TABLE charge ADD COLUMN b text;" {
		t.Errorf("squawk's finding became %+v, want statement 2, line 3, squawk:ban-drop-column", v)
	}
	args, err := os.ReadFile(log)
	if err != nil {
		t.Fatal(err)
	}
	// goose runs 00003 outside a transaction: squawk must know, or it
	// would neither refuse CONCURRENTLY in a transaction nor ask a file
	// that can stop half-applied for IF NOT EXISTS.
	for _, want := range []string{"--assume-in-transaction 00001_base.sql 00002_alter.sql\n", "--no-assume-in-transaction 00003_index.sql\n"} {
		if !strings.Contains(string(args), want) {
			t.Errorf("squawk ran with %q, want a run ending %q", args, want)
		}
	}
	given, err := os.ReadFile(log + ".files")
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(given), "DROP TABLE") {
		t.Errorf("squawk was given a Down section:\n%s", given)
	}
}

func TestSquawk_FailureToRunIsAnError(t *testing.T) {
	squawk := migrationlint.Squawk{Path: "/bin/false", Config: ".squawk.toml"}
	if _, err := lintFS(t, map[string]string{"00001_base.sql": baseFile}, &squawk); err == nil {
		t.Error("squawk exited 1 with no report, and the lint passed")
	}
}

package migrations_test

import (
	"context"
	"os"
	"testing"

	"example.com/billing/internal/migrationlint"
)

// Every migration follows billing's migration rules, or has its exception
// recorded in lint-exceptions.md (docs/deployment.md, "Migrations while
// billing runs"). make lint-migrations checks squawk's rules as well; this
// test keeps billing's in make test, on a machine with only Go.
func TestMigrationsFollowTheRules(t *testing.T) {
	report, err := migrationlint.Lint(context.Background(), os.DirFS("."), nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range report.Violations {
		t.Errorf("%v", v)
	}
	for _, e := range report.Stale {
		t.Errorf("%s:%d: the exception for %s statement %d (%s) matches no violation: remove it", migrationlint.ExceptionsFile, e.Line, e.File, e.Statement, e.Rule)
	}
	if report.Files < 7 || report.Excused == 0 {
		t.Errorf("linted %d migrations with %d exceptions used: not the migrations of this directory", report.Files, report.Excused)
	}
}

package migrationlint_test

import (
	"strings"
	"testing"

	"example.com/billing/internal/migrationlint"
)

func TestParseFile_SplitsUpAsGooseDoes(t *testing.T) {
	src := `-- A migration.

-- +goose Up
-- a comment before a statement is not part of it
CREATE TABLE a (
    id bigint -- a comment inside it is
);
SELECT 1; SELECT 2;

-- +goose StatementBegin
CREATE FUNCTION f() RETURNS int LANGUAGE plpgsql AS $$
BEGIN
    RETURN 1;
END
$$;
-- +goose StatementEnd
ALTER TABLE a
    ADD COLUMN b text; -- the statement ends here

-- +goose Down
DROP TABLE a;
`
	f, err := migrationlint.ParseFile("00009_x.sql", []byte(src))
	if err != nil {
		t.Fatal(err)
	}
	want := []migrationlint.Statement{
		{Index: 1, Line: 5, EndLine: 7, SQL: "CREATE TABLE a (\n    id bigint -- a comment inside it is\n);"},
		// goose splits at the end of a line, not at every semicolon.
		{Index: 2, Line: 8, EndLine: 8, SQL: "SELECT 1; SELECT 2;"},
		{Index: 3, Line: 11, EndLine: 15, SQL: "CREATE FUNCTION f() RETURNS int LANGUAGE plpgsql AS $$\nBEGIN\n    RETURN 1;\nEND\n$$;"},
		{Index: 4, Line: 17, EndLine: 18, SQL: "ALTER TABLE a\n    ADD COLUMN b text; -- the statement ends here"},
	}
	if len(f.Up) != len(want) {
		t.Fatalf("%d statements %+v, want %d", len(f.Up), f.Up, len(want))
	}
	for i := range want {
		if f.Up[i] != want[i] {
			t.Errorf("statement %d = %+v, want %+v", i+1, f.Up[i], want[i])
		}
	}
	if f.NoTransaction {
		t.Error("NoTransaction without the annotation")
	}
	if f.UpEnd != 19 {
		t.Errorf("the Up section ends on line %d, want 19", f.UpEnd)
	}
}

func TestParseFile_NoTransaction(t *testing.T) {
	f, err := migrationlint.ParseFile("x.sql", []byte("-- +goose NO TRANSACTION\n-- +goose Up\nCREATE INDEX CONCURRENTLY i ON t (c);\n"))
	if err != nil {
		t.Fatal(err)
	}
	if !f.NoTransaction || len(f.Up) != 1 || f.UpEnd != 3 {
		t.Errorf("got %+v, want one statement in a NO TRANSACTION file whose Up section ends on line 3", f)
	}
}

func TestParseFile_Errors(t *testing.T) {
	for name, src := range map[string]string{
		"ErrNoUp":                "CREATE TABLE a (id int);\n",
		"ErrUnfinishedStatement": "-- +goose Up\nCREATE TABLE a (id int)\n-- +goose Down\nDROP TABLE a;\n",
		"ErrNoStatementEnd":      "-- +goose Up\n-- +goose StatementBegin\nDO $$ BEGIN END $$;\n",
		"ErrTwoUps":              "-- +goose Up\n-- +goose Up\n",
		"ErrUnknownAnnotation":   "-- +goose Up\n-- +goose Sideways\n",
	} {
		t.Run(name, func(t *testing.T) {
			if f, err := migrationlint.ParseFile("x.sql", []byte(src)); err == nil {
				t.Errorf("parsed %+v, want an error", f)
			} else if !strings.Contains(err.Error(), "x.sql") {
				t.Errorf("error %q does not name the file", err)
			}
		})
	}
}

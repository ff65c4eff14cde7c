package migrationlint_test

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"example.com/billing/internal/migrationlint"
)

// base stands for the released schema: billing's hot tables (two of them
// partitioned, as since migrations 2 and 5), a table serve writes that is
// not hot, and an index on charge.
const base = `
CREATE TABLE charge (event_id uuid PRIMARY KEY, order_id bigint NOT NULL, customer_id bigint, status text);
CREATE TABLE processed_event (event_id uuid, consumer_group text) PARTITION BY RANGE (event_id);
CREATE TABLE outbox (event_id uuid, seq bigint) PARTITION BY RANGE (event_id);
CREATE TABLE consumer_position (consumer_group text, next_offset bigint);
CREATE INDEX charge_order ON charge (order_id);
CREATE INDEX outbox_seq ON outbox (seq);
`

// checkLast lints base, then the migrations of before, then sql (marked NO
// TRANSACTION when noTx), and returns the last one's violations as
// "<statement> <rule>".
func checkLast(t *testing.T, before []string, sql string, noTx bool) []string {
	t.Helper()
	got := []string{}
	for _, v := range violationsOfLast(t, before, sql, noTx) {
		got = append(got, fmt.Sprintf("%d %s", v.Statement, v.Rule))
	}
	return got
}

func violationsOfLast(t *testing.T, before []string, sql string, noTx bool) []migrationlint.Violation {
	t.Helper()
	var files []migrationlint.File
	add := func(body string, noTx bool) {
		src := "-- +goose Up\n" + body + "\n-- +goose Down\nDROP TABLE whatever;\n"
		if noTx {
			src = "-- +goose NO TRANSACTION\n" + src
		}
		f, err := migrationlint.ParseFile(fmt.Sprintf("%05d_m.sql", len(files)+1), []byte(src))
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, f)
	}
	add(base, false)
	for _, b := range before {
		add(b, false)
	}
	add(sql, noTx)
	last := files[len(files)-1].Name
	var out []migrationlint.Violation
	for _, v := range migrationlint.Check(files) {
		if v.File != last {
			t.Fatalf("an earlier migration broke a rule: %v", v)
		}
		out = append(out, v)
	}
	return out
}

type ruleCase struct {
	name   string
	before []string // earlier migrations' Up sections
	sql    string
	noTx   bool
	want   []string // "<statement> <rule>", in statement order
}

func runRuleCases(t *testing.T, cases []ruleCase) {
	t.Helper()
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := checkLast(t, c.before, c.sql, c.noTx)
			want := c.want
			if want == nil {
				want = []string{}
			}
			if !slices.Equal(got, want) {
				t.Errorf("violations %q, want %q\nSQL:\n%s", got, want, c.sql)
			}
		})
	}
}

func TestLockTimeout(t *testing.T) {
	runRuleCases(t, []ruleCase{
		{name: "ErrAlterWithoutTimeout", sql: `ALTER TABLE charge ADD COLUMN note text;`,
			want: []string{"1 lock-timeout"}},
		{name: "OK_SetLocal", sql: "SET LOCAL lock_timeout = '2s';\nALTER TABLE charge ADD COLUMN note text;"},
		{name: "OK_SetTo", sql: "SET lock_timeout TO '2s';\nALTER TABLE charge ADD COLUMN note text;"},
		{name: "OK_SetConfig", sql: "SELECT set_config('lock_timeout', '2s', true);\nALTER TABLE charge ADD COLUMN note text;"},
		{name: "ErrTimeoutZero", sql: "SET lock_timeout = 0;\nALTER TABLE charge ADD COLUMN note text;",
			want: []string{"2 lock-timeout"}},
		{name: "ErrTimeoutDefault", sql: "SET lock_timeout TO DEFAULT;\nALTER TABLE charge ADD COLUMN note text;",
			want: []string{"2 lock-timeout"}},
		{name: "ErrAfterReset", sql: "SET LOCAL lock_timeout = '2s';\nALTER TABLE charge ADD COLUMN a text;\nRESET lock_timeout;\nALTER TABLE charge ADD COLUMN b text;",
			want: []string{"4 lock-timeout"}},
		{name: "ErrSetLocalInNoTransactionFile", noTx: true,
			sql:  "SET LOCAL lock_timeout = '2s';\nCREATE INDEX CONCURRENTLY IF NOT EXISTS charge_customer ON charge (customer_id);",
			want: []string{"2 lock-timeout"}},
		{name: "OK_SessionSetInNoTransactionFile", noTx: true,
			sql: "SET lock_timeout = '2s';\nCREATE INDEX CONCURRENTLY IF NOT EXISTS charge_customer ON charge (customer_id);\nRESET lock_timeout;"},
		{name: "ErrPartition", sql: `ALTER TABLE processed_event_p20250101 SET (fillfactor = 90);`,
			want: []string{"1 lock-timeout"}},
		{name: "ErrProcessedEvent", sql: `ALTER TABLE processed_event ALTER COLUMN consumer_group SET DEFAULT 'g';`,
			want: []string{"1 lock-timeout"}},
		{name: "ErrOutboxSchemaQualified", sql: `ALTER TABLE public.outbox ADD COLUMN note text;`,
			want: []string{"1 lock-timeout"}},
		{name: "ErrQuotedIdentifier", sql: `ALTER TABLE "outbox" ADD COLUMN note text;`,
			want: []string{"1 lock-timeout"}},
		{name: "ErrRenamedHotTableStaysHot",
			sql:  "SET LOCAL lock_timeout = '2s';\nALTER TABLE charge RENAME TO charge_old;\nRESET lock_timeout;\nDROP TABLE charge_old;",
			want: []string{"4 lock-timeout"}},
		{name: "ErrForeignKeyToHotTable", sql: `CREATE TABLE refund (event_id uuid REFERENCES charge (event_id));`,
			want: []string{"1 lock-timeout"}},
		{name: "ErrDropIndexOfHotTable", noTx: true, sql: `DROP INDEX CONCURRENTLY IF EXISTS charge_order;`,
			want: []string{"1 lock-timeout"}},
		{name: "ErrDoBlockNamesHotTable",
			sql:  "-- +goose StatementBegin\nDO $$ BEGIN EXECUTE format('ALTER TABLE %I ADD COLUMN x int', 'charge'); END $$;\n-- +goose StatementEnd",
			want: []string{"1 lock-timeout"}},
		{name: "OK_TableCreatedInThisFile", sql: "CREATE TABLE processed_event_p20300101 (event_id uuid);\nALTER TABLE processed_event_p20300101 ADD COLUMN x int;\nCREATE INDEX pe_x ON processed_event_p20300101 (x);"},
		{name: "OK_FunctionBodyNamesHotTable",
			sql: "-- +goose StatementBegin\nCREATE OR REPLACE FUNCTION charges() RETURNS bigint LANGUAGE sql AS $$ SELECT count(*) FROM charge $$;\n-- +goose StatementEnd"},
		{name: "OK_DataAndGrants", sql: "INSERT INTO charge (event_id) VALUES (gen_random_uuid());\nGRANT SELECT ON charge TO billing_runtime;"},
		{name: "OK_NotHotTable", sql: `ALTER TABLE consumer_position ADD COLUMN note text;`},
		{name: "OK_HotNameInStringOrComment", sql: "ALTER TABLE consumer_position -- charge\n  ADD COLUMN note text DEFAULT 'charge';"},
	})
}

func TestConcurrentIndex(t *testing.T) {
	runRuleCases(t, []ruleCase{
		{name: "ErrCreateIndexInTransaction", sql: "SET LOCAL lock_timeout = '2s';\nCREATE INDEX charge_customer ON charge (customer_id);",
			want: []string{"2 concurrent-index"}},
		{name: "ErrUniqueOnColdTable", sql: `CREATE UNIQUE INDEX cp_group ON consumer_position (consumer_group);`,
			want: []string{"1 concurrent-index"}},
		{name: "ErrConcurrentlyInTransactionalFile", sql: `CREATE INDEX CONCURRENTLY cp_offset ON consumer_position (next_offset);`,
			want: []string{"1 concurrent-index"}},
		{name: "OK_ConcurrentlyInNoTransactionFile", noTx: true,
			sql: "DROP INDEX CONCURRENTLY IF EXISTS cp_offset;\nCREATE INDEX CONCURRENTLY IF NOT EXISTS cp_offset ON consumer_position (next_offset);"},
		{name: "OK_UniqueConcurrently", noTx: true, sql: `CREATE UNIQUE INDEX CONCURRENTLY IF NOT EXISTS cp_group ON consumer_position (consumer_group);`},
		{name: "OK_TableCreatedInThisFile", sql: "CREATE TABLE refund (id bigint);\nCREATE INDEX refund_id ON refund (id);\nDROP INDEX refund_id;"},
		{name: "ErrPartitionedWithoutOnly", noTx: true,
			sql:  "SET lock_timeout = '2s';\nCREATE INDEX CONCURRENTLY IF NOT EXISTS outbox_seq_idx ON outbox (seq);",
			want: []string{"2 concurrent-index"}},
		{name: "ErrOnlyOnPlainTable", sql: "SET LOCAL lock_timeout = '2s';\nCREATE INDEX charge_customer ON ONLY charge (customer_id);",
			want: []string{"2 concurrent-index"}},
		{name: "OK_PartitionedParentOnly", sql: "SET LOCAL lock_timeout = '2s';\nCREATE INDEX IF NOT EXISTS outbox_seq_idx ON ONLY outbox (seq);"},
		{name: "ErrDropIndex", sql: "SET LOCAL lock_timeout = '2s';\nDROP INDEX charge_order;",
			want: []string{"2 concurrent-index"}},
		{name: "OK_DropIndexOfPartitionedTable", sql: "SET LOCAL lock_timeout = '2s';\nDROP INDEX outbox_seq;"},
		{name: "ErrDropIndexOfPartitionedTableNoTimeout", sql: "DROP INDEX outbox_seq;",
			want: []string{"1 lock-timeout"}},
		{name: "ErrReindex", sql: "SET LOCAL lock_timeout = '2s';\nREINDEX INDEX charge_order;",
			want: []string{"2 concurrent-index"}},
		{name: "ErrReindexNoTimeout", noTx: true, sql: "REINDEX INDEX CONCURRENTLY charge_order;",
			want: []string{"1 lock-timeout"}},
	})
}

func TestNotValid(t *testing.T) {
	addNotValid := "ALTER TABLE consumer_position ADD CONSTRAINT cp_offset_nonneg CHECK (next_offset >= 0) NOT VALID;"
	runRuleCases(t, []ruleCase{
		{name: "ErrCheck", sql: `ALTER TABLE consumer_position ADD CONSTRAINT cp_offset_nonneg CHECK (next_offset >= 0);`,
			want: []string{"1 not-valid"}},
		{name: "OK_CheckNotValid", sql: addNotValid},
		{name: "ErrValidateInSameTransaction", sql: addNotValid + "\nALTER TABLE consumer_position VALIDATE CONSTRAINT cp_offset_nonneg;",
			want: []string{"2 not-valid"}},
		{name: "OK_ValidateInLaterMigration", before: []string{addNotValid},
			sql: `ALTER TABLE consumer_position VALIDATE CONSTRAINT cp_offset_nonneg;`},
		{name: "OK_ValidateLaterInNoTransactionFile", noTx: true,
			sql: addNotValid + "\nALTER TABLE consumer_position VALIDATE CONSTRAINT cp_offset_nonneg;"},
		{name: "ErrForeignKey", sql: "SET LOCAL lock_timeout = '2s';\nALTER TABLE consumer_position ADD COLUMN event_id uuid, ADD CONSTRAINT cp_event FOREIGN KEY (event_id) REFERENCES charge (event_id);",
			want: []string{"2 not-valid"}},
		{name: "OK_ForeignKeyNotValid", sql: "SET LOCAL lock_timeout = '2s';\nALTER TABLE consumer_position ADD CONSTRAINT cp_event FOREIGN KEY (event_id) REFERENCES charge (event_id) NOT VALID;"},
		{name: "ErrUnique", sql: `ALTER TABLE consumer_position ADD CONSTRAINT cp_group UNIQUE (consumer_group);`,
			want: []string{"1 not-valid"}},
		{name: "ErrPrimaryKey", sql: `ALTER TABLE consumer_position ADD PRIMARY KEY (consumer_group);`,
			want: []string{"1 not-valid"}},
		{name: "OK_UniqueUsingIndex", sql: `ALTER TABLE consumer_position ADD CONSTRAINT cp_group UNIQUE USING INDEX cp_group;`},
		{name: "ErrConstraintWithColumn", sql: `ALTER TABLE consumer_position ADD COLUMN lag bigint CHECK (lag >= 0);`,
			want: []string{"1 not-valid"}},
		{name: "ErrReferencesWithColumn", sql: "SET LOCAL lock_timeout = '2s';\nALTER TABLE consumer_position ADD COLUMN event_id uuid REFERENCES charge;",
			want: []string{"2 not-valid"}},
		{name: "OK_NewTable", sql: "CREATE TABLE refund (id bigint);\nALTER TABLE refund ADD CONSTRAINT refund_id CHECK (id > 0);\nALTER TABLE refund ALTER COLUMN id SET NOT NULL;"},
		{name: "ErrSetNotNull", sql: `ALTER TABLE consumer_position ALTER COLUMN next_offset SET NOT NULL;`,
			want: []string{"1 not-valid"}},
		{name: "OK_SetNotNullAfterValidatedCheck",
			before: []string{"ALTER TABLE consumer_position ADD CONSTRAINT cp_offset_nn CHECK (next_offset IS NOT NULL) NOT VALID;",
				"ALTER TABLE consumer_position VALIDATE CONSTRAINT cp_offset_nn;"},
			sql: `ALTER TABLE consumer_position ALTER COLUMN next_offset SET NOT NULL;`},
	})
}

func TestNoRewrite(t *testing.T) {
	const timeout = "SET LOCAL lock_timeout = '2s';\n"
	addCheck := "ALTER TABLE charge ADD CONSTRAINT charge_status_nn CHECK (status IS NOT NULL) NOT VALID;"
	validate := "ALTER TABLE charge VALIDATE CONSTRAINT charge_status_nn;"
	runRuleCases(t, []ruleCase{
		{name: "ErrAlterColumnType", sql: timeout + `ALTER TABLE charge ALTER COLUMN order_id TYPE numeric;`,
			want: []string{"2 no-rewrite"}},
		{name: "ErrSetDataType", sql: timeout + `ALTER TABLE outbox ALTER seq SET DATA TYPE numeric;`,
			want: []string{"2 no-rewrite"}},
		{name: "OK_TypeOfColdTable", sql: `ALTER TABLE consumer_position ALTER COLUMN next_offset TYPE numeric;`},
		{name: "ErrVolatileDefault", sql: timeout + `ALTER TABLE charge ADD COLUMN k uuid DEFAULT gen_random_uuid();`,
			want: []string{"2 no-rewrite"}},
		{name: "ErrClockDefault", sql: timeout + `ALTER TABLE charge ADD COLUMN at timestamptz NOT NULL DEFAULT clock_timestamp();`,
			want: []string{"2 no-rewrite"}},
		{name: "OK_ConstantAndStableDefaults", sql: timeout + "ALTER TABLE charge ADD COLUMN requests integer NOT NULL DEFAULT 0,\n" +
			"  ADD COLUMN seen timestamptz NOT NULL DEFAULT now(),\n  ADD COLUMN tags jsonb NOT NULL DEFAULT '{}'::jsonb,\n  ADD COLUMN code varchar(3) DEFAULT 'x'::varchar(3);"},
		{name: "ErrSerial", sql: timeout + `ALTER TABLE charge ADD COLUMN n bigserial;`,
			want: []string{"2 no-rewrite"}},
		{name: "ErrStoredGenerated", sql: timeout + `ALTER TABLE charge ADD COLUMN twice bigint GENERATED ALWAYS AS (order_id * 2) STORED;`,
			want: []string{"2 no-rewrite"}},
		{name: "ErrSetNotNullWithoutCheck", sql: timeout + `ALTER TABLE charge ALTER COLUMN status SET NOT NULL;`,
			want: []string{"2 no-rewrite"}},
		{name: "ErrSetNotNullCheckNotValidated", before: []string{timeout + addCheck},
			sql:  timeout + `ALTER TABLE charge ALTER COLUMN status SET NOT NULL;`,
			want: []string{"2 no-rewrite"}},
		{name: "ErrSetNotNullCheckOnAnotherColumn", before: []string{timeout + addCheck, timeout + validate},
			sql:  timeout + `ALTER TABLE charge ALTER COLUMN customer_id SET NOT NULL;`,
			want: []string{"2 no-rewrite"}},
		{name: "OK_SetNotNullAfterValidatedCheck", before: []string{timeout + addCheck, timeout + validate},
			sql: timeout + "ALTER TABLE charge ALTER COLUMN status SET NOT NULL;\nALTER TABLE charge DROP CONSTRAINT charge_status_nn;"},
		{name: "ErrSetTablespace", sql: timeout + `ALTER TABLE charge SET TABLESPACE fast;`,
			want: []string{"2 no-rewrite"}},
		{name: "ErrVacuumFull", noTx: true, sql: "SET lock_timeout = '2s';\nVACUUM FULL charge;",
			want: []string{"2 no-rewrite"}},
		{name: "ErrVacuumFullOptionList", noTx: true, sql: "SET lock_timeout = '2s';\nVACUUM (FULL, ANALYZE) processed_event_p20250101;",
			want: []string{"2 no-rewrite"}},
		{name: "ErrVacuumFullEverything", noTx: true, sql: `VACUUM FULL;`,
			want: []string{"1 no-rewrite"}},
		{name: "OK_PlainVacuum", noTx: true, sql: "SET lock_timeout = '2s';\nVACUUM (ANALYZE) charge;"},
		{name: "ErrCluster", sql: timeout + `CLUSTER charge USING charge_pkey;`,
			want: []string{"2 no-rewrite"}},
		{name: "ErrUpdateEveryRow", sql: `UPDATE charge SET status = 'succeeded';`,
			want: []string{"1 no-rewrite"}},
		{name: "ErrDeleteEveryRow", sql: `DELETE FROM outbox;`,
			want: []string{"1 no-rewrite"}},
		{name: "OK_UpdateBatch", sql: `UPDATE charge SET status = 'succeeded' WHERE event_id < '01900000-0000-7000-8000-000000000000';`},
		{name: "OK_UpdateColdTable", sql: `UPDATE consumer_position SET next_offset = 0;`},
	})
}

func TestSquawkDirectivesAreRefused(t *testing.T) {
	got := checkLast(t, nil, "-- squawk-ignore ban-drop-column\nALTER TABLE consumer_position DROP COLUMN next_offset;", false)
	if !slices.Equal(got, []string{"0 squawk-directive"}) {
		t.Errorf("violations %q, want the squawk-ignore comment refused", got)
	}
}

// Every message says what the statement does wrong and what to do instead,
// naming the table.
func TestMessagesNameTheTable(t *testing.T) {
	vs := violationsOfLast(t, nil, "ALTER TABLE charge ALTER COLUMN order_id TYPE numeric;", false)
	if len(vs) != 2 {
		t.Fatalf("violations %v, want lock-timeout and no-rewrite", vs)
	}
	for _, v := range vs {
		if !strings.Contains(v.Message, "charge") || v.Excerpt != "ALTER TABLE charge ALTER COLUMN order_id TYPE numeric;" {
			t.Errorf("%+v: the message does not name charge, or the excerpt is not the statement's beginning", v)
		}
	}
}

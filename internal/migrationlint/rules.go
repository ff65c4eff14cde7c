package migrationlint

import (
	"fmt"
	"regexp"
	"strings"
)

// The rules billing adds to squawk's. Their names are what
// lint-exceptions.md records.
const (
	// RuleLockTimeout: every DDL statement on a hot table comes after a
	// lock_timeout that is in force for it. A DDL statement waiting for its
	// lock queues every later claim and settle on that table behind it;
	// with lock_timeout it gives up instead and the migration is retried.
	RuleLockTimeout = "lock-timeout"
	// RuleConcurrentIndex: an index on an existing table is built (and
	// dropped) CONCURRENTLY, which goose can run only in a file marked
	// `-- +goose NO TRANSACTION`.
	RuleConcurrentIndex = "concurrent-index"
	// RuleNotValid: a CHECK or FOREIGN KEY constraint on an existing table
	// is added NOT VALID and validated by a later migration; a UNIQUE or
	// PRIMARY KEY one is added USING an index built concurrently.
	RuleNotValid = "not-valid"
	// RuleNoRewrite: nothing rewrites or scans a hot table under an
	// exclusive lock: no column type change, volatile default, SET NOT
	// NULL without a validated CHECK, VACUUM FULL, CLUSTER, or update of
	// every row in one statement.
	RuleNoRewrite = "no-rewrite"
	// RuleSquawkDirective: squawk's own ignore comments are not used in
	// migrations; exceptions are recorded, with a reason, in
	// lint-exceptions.md, where all of them can be read.
	RuleSquawkDirective = "squawk-directive"
)

// hotTables are the tables serve writes on every event; their day
// partitions are <table>_pYYYYMMDD (ensure_day_partition).
var (
	hotTables    = map[string]bool{"charge": true, "processed_event": true, "outbox": true}
	hotPartition = regexp.MustCompile(`^(charge|processed_event|outbox)_p[0-9]{8}$`)
	identifier   = regexp.MustCompile(`[A-Za-z_][A-Za-z0-9_$]*`)
	// squawkComment is squawk's in-file configuration: squawk-ignore,
	// squawk-ignore-file, squawk-disable-assume-in-transaction.
	squawkComment = regexp.MustCompile(`--\s*squawk-(ignore|disable)`)
)

// Violation is a rule a statement breaks.
type Violation struct {
	File string
	// Statement is the Up statement's Index; 0 for the file as a whole.
	Statement int
	Line      int
	Rule      string
	Message   string
	// Excerpt is how the statement begins.
	Excerpt string
}

func (v Violation) String() string {
	return fmt.Sprintf("%s:%d: %s (statement %d): %s", v.File, v.Line, v.Rule, v.Statement, v.Message)
}

// schema is what the migrations before the current statement created, as
// far as the rules need it.
type schema struct {
	partitioned map[string]bool        // tables created PARTITION BY
	indexTable  map[string]string      // index → its table
	constraints map[string]*constraint // "table.name" → constraint
}

type constraint struct {
	table         string
	notNullColumn string // the column of a CHECK (column IS NOT NULL)
	valid         bool
}

// fileState is what the rules remember within one migration.
type fileState struct {
	file File
	// fresh holds the tables and indexes created earlier in this file:
	// nothing of the running release uses them, so nothing waits on them.
	fresh map[string]bool
	// hotAlias holds the names a hot table was renamed to in this file.
	hotAlias map[string]bool
	// lockTimeout is set by a SET lock_timeout in force for the rest of the
	// file; localIgnored remembers a SET LOCAL that had no effect.
	lockTimeout  bool
	localIgnored bool
	// addedNotValid holds the constraints this file added NOT VALID.
	addedNotValid map[string]bool
}

// Check applies billing's rules to the Up sections of files, in order (the
// order goose applies them): what an earlier migration created is known to
// a later one.
func Check(files []File) []Violation {
	s := &schema{partitioned: map[string]bool{}, indexTable: map[string]string{}, constraints: map[string]*constraint{}}
	var out []Violation
	for _, f := range files {
		st := &fileState{file: f, fresh: map[string]bool{}, hotAlias: map[string]bool{}, addedNotValid: map[string]bool{}}
		out = append(out, squawkDirectives(f)...)
		for _, stmt := range f.Up {
			for _, r := range s.check(st, stmt) {
				out = append(out, Violation{File: f.Name, Statement: stmt.Index, Line: stmt.Line, Rule: r.rule, Message: r.message, Excerpt: excerpt(stmt.SQL)})
			}
		}
	}
	return out
}

// squawkDirectives finds squawk's ignore comments in a file.
func squawkDirectives(f File) []Violation {
	var out []Violation
	for i, line := range strings.Split(string(f.Source), "\n") {
		if squawkComment.MatchString(line) {
			out = append(out, Violation{File: f.Name, Line: i + 1, Rule: RuleSquawkDirective,
				Message: "squawk's ignore comments are not used in migrations: record the exception, with its reason, in db/migrations/lint-exceptions.md"})
		}
	}
	return out
}

type finding struct{ rule, message string }

func (st *fileState) isHot(name string) bool {
	if st.fresh[name] {
		return false
	}
	return hotTables[name] || hotPartition.MatchString(name) || st.hotAlias[name]
}

// check classifies one statement, applies the rules and records what it
// changes in the schema.
func (s *schema) check(st *fileState, stmt Statement) []finding {
	ts := tokens(tokenize(stmt.SQL))
	if len(ts) == 0 {
		return nil
	}
	if st.lockSetting(ts) {
		return nil
	}
	var out []finding
	first := ts.at(0)
	// CREATE TABLE makes its name fresh before the references are looked
	// at: a table created in this migration is not the hot one it may be
	// named after (00002 renames processed_event away and creates a new one).
	if created, partitioned := createdTable(ts); created != "" {
		st.fresh[created] = true
		delete(st.hotAlias, created)
		s.partitioned[created] = partitioned
	}
	if first.is("alter", "create", "drop", "truncate", "lock", "vacuum", "cluster", "reindex", "do") && !isRoutine(ts) {
		if hot := s.hotTablesNamed(st, ts); len(hot) > 0 && !st.lockTimeout {
			msg := fmt.Sprintf("DDL on hot table %s with no lock_timeout in force: while it waits for its lock every claim and settle queues behind it; SET lock_timeout first (SET LOCAL in a transactional migration)", strings.Join(hot, ", "))
			if st.localIgnored {
				msg += "; the SET LOCAL lock_timeout before it had no effect, since this file is NO TRANSACTION"
			}
			out = append(out, finding{RuleLockTimeout, msg})
		}
	}
	if !st.file.NoTransaction && ts.has("concurrently") {
		out = append(out, finding{RuleConcurrentIndex, "CONCURRENTLY cannot run inside a transaction block: mark the file -- +goose NO TRANSACTION (and keep its other statements safe to run again)"})
	}
	switch {
	case first.is("create") && createsIndex(ts):
		out = append(out, s.createIndex(st, ts)...)
	case ts.seq(0, "drop", "index"):
		out = append(out, s.dropIndex(st, ts)...)
	case ts.seq(0, "reindex"):
		if !ts.has("concurrently") && !s.reindexFresh(st, ts) {
			out = append(out, finding{RuleConcurrentIndex, "REINDEX without CONCURRENTLY locks the table against writes while it rebuilds"})
		}
	case ts.seq(0, "alter", "table"):
		out = append(out, s.alterTable(st, ts)...)
	case ts.seq(0, "alter", "index"):
		s.alterIndex(st, ts)
	case first.is("vacuum"):
		if full, tables := vacuumFull(ts); full {
			out = append(out, st.rewrites(tables, "VACUUM FULL rewrites", "use pg_repack, or let autovacuum reuse the space")...)
		}
	case first.is("cluster"):
		i := 1
		if ts.at(i).is("verbose") {
			i++
		}
		var tables []string // none: every table clustered before
		if name, _ := ts.qualifiedName(i); name != "" {
			tables = append(tables, name)
		}
		out = append(out, st.rewrites(tables, "CLUSTER rewrites", "use pg_repack")...)
	case first.is("update", "delete"):
		out = append(out, st.wholeTableWrite(ts)...)
	}
	return out
}

// lockSetting recognises SET / RESET lock_timeout and set_config, and
// records whether a lock_timeout is in force afterwards.
func (st *fileState) lockSetting(ts tokens) bool {
	var local, on bool
	switch {
	case ts.at(0).is("set"):
		i := 1
		if ts.at(i).is("local") {
			local = true
			i++
		} else if ts.at(i).is("session") {
			i++
		}
		if !ts.at(i).is("lock_timeout") {
			return false
		}
		v := ts.at(i + 2) // after TO or =
		on = !v.is("default") && !isZero(v.text)
	case ts.seq(0, "reset", "lock_timeout"), ts.seq(0, "reset", "all"):
		st.lockTimeout = false
		return true
	case ts.seq(0, "select", "set_config") && ts.at(3).kind == str && ts.at(3).text == "lock_timeout":
		// SELECT set_config('lock_timeout', '2s', is_local)
		on = !isZero(ts.at(5).text)
		local = ts.at(7).is("true")
	default:
		return false
	}
	if local && st.file.NoTransaction {
		// Outside a transaction block SET LOCAL only warns and changes
		// nothing.
		st.localIgnored = true
		return true
	}
	st.lockTimeout = on
	return true
}

func isZero(v string) bool {
	v = strings.TrimSpace(strings.ToLower(v))
	return strings.TrimLeft(strings.TrimRight(v, "msinh"), "0") == "" && strings.HasPrefix(v, "0")
}

// isRoutine reports whether ts creates a function or procedure: its body
// names tables but takes no lock on them.
func isRoutine(ts tokens) bool {
	i := 1
	if ts.seq(1, "or", "replace") {
		i = 3
	}
	return ts.at(0).is("create") && ts.at(i).is("function", "procedure")
}

// hotTablesNamed returns the hot tables a DDL statement names. A DO block's
// body is searched as text, strings included, since it usually builds its
// statements with format().
func (s *schema) hotTablesNamed(st *fileState, ts tokens) []string {
	seen := map[string]bool{}
	var out []string
	add := func(n string) {
		if st.isHot(n) && !seen[n] {
			seen[n] = true
			out = append(out, n)
		}
	}
	isIndexDDL := ts.seq(0, "drop", "index") || ts.seq(0, "alter", "index") || ts.seq(0, "reindex")
	for _, t := range ts {
		switch t.kind {
		case word, ident:
			add(t.text)
			if isIndexDDL && !st.fresh[t.text] {
				// DROP, ALTER and REINDEX of an index lock its table.
				if table, ok := s.indexTable[t.text]; ok {
					add(table)
				}
			}
		case dollar:
			if ts.at(0).is("do") {
				for _, n := range identifier.FindAllString(t.text, -1) {
					add(strings.ToLower(n))
				}
			}
		}
	}
	return out
}

// createdTable returns the table a CREATE TABLE statement creates and
// whether it is partitioned.
func createdTable(ts tokens) (string, bool) {
	if !ts.at(0).is("create") {
		return "", false
	}
	i := 1
	for ts.at(i).is("global", "local", "temp", "temporary", "unlogged") {
		i++
	}
	if !ts.at(i).is("table") {
		return "", false
	}
	i++
	if ts.seq(i, "if", "not", "exists") {
		i += 3
	}
	name, _ := ts.qualifiedName(i)
	partitioned := false
	for j := range ts {
		if ts.seq(j, "partition", "by") {
			partitioned = true
		}
	}
	return name, partitioned
}

func createsIndex(ts tokens) bool {
	return ts.at(1).is("index") || ts.seq(1, "unique", "index")
}

// createIndex: CREATE [UNIQUE] INDEX [CONCURRENTLY] [IF NOT EXISTS] [name]
// ON [ONLY] table.
func (s *schema) createIndex(st *fileState, ts tokens) []finding {
	on := -1
	for i, t := range ts {
		if t.is("on") {
			on = i
			break
		}
	}
	if on < 0 {
		return nil
	}
	only := ts.at(on + 1).is("only")
	i := on + 1
	if only {
		i++
	}
	table, _ := ts.qualifiedName(i)
	if name, ok := ts.at(on - 1).name(); ok && !ts.at(on-1).is("index", "concurrently", "exists") {
		s.indexTable[name] = table
		st.fresh[name] = st.fresh[table]
	}
	switch {
	case st.fresh[table]:
		return nil
	case s.partitioned[table] && only:
		// The parent's index alone, invalid until every partition's index
		// (built CONCURRENTLY) is attached: the way to index a partitioned
		// table without locking it.
		return nil
	case s.partitioned[table]:
		return []finding{{RuleConcurrentIndex, fmt.Sprintf("CREATE INDEX on partitioned table %s builds every partition's index under a lock that blocks writes, and cannot be CONCURRENTLY: CREATE INDEX ... ON ONLY %s, then CREATE INDEX CONCURRENTLY on each partition and ALTER INDEX ... ATTACH PARTITION", table, table)}}
	case !ts.seq(1, "index", "concurrently") && !ts.seq(1, "unique", "index", "concurrently"):
		return []finding{{RuleConcurrentIndex, fmt.Sprintf("CREATE INDEX on existing table %s without CONCURRENTLY blocks its writes for the whole build", table)}}
	}
	return nil
}

// dropIndex: DROP INDEX [CONCURRENTLY] [IF EXISTS] name [, ...].
func (s *schema) dropIndex(st *fileState, ts tokens) []finding {
	i := 2
	concurrently := ts.at(i).is("concurrently")
	if concurrently {
		i++
	}
	if ts.seq(i, "if", "exists") {
		i += 2
	}
	var out []finding
	for _, part := range ts[min(i, len(ts)):].splitTopLevel() {
		name, _ := part.qualifiedName(0)
		if name == "" || part.at(0).is("cascade", "restrict") {
			continue
		}
		table := s.indexTable[name]
		// A partitioned table's index cannot be dropped CONCURRENTLY; with
		// a lock_timeout its drop is brief (no data is read).
		exempt := st.fresh[name] || st.fresh[table] || s.partitioned[table]
		delete(s.indexTable, name)
		if !concurrently && !exempt {
			out = append(out, finding{RuleConcurrentIndex, fmt.Sprintf("DROP INDEX %s without CONCURRENTLY takes an ACCESS EXCLUSIVE lock on its table", name)})
		}
	}
	return out
}

// reindexFresh: REINDEX {INDEX|TABLE} [CONCURRENTLY] name.
func (s *schema) reindexFresh(st *fileState, ts tokens) bool {
	i := 2
	if ts.at(i).is("concurrently") {
		i++
	}
	name, _ := ts.qualifiedName(i)
	return st.fresh[name] || st.fresh[s.indexTable[name]]
}

// alterIndex follows renames of indexes.
func (s *schema) alterIndex(st *fileState, ts tokens) {
	i := 2
	if ts.seq(i, "if", "exists") {
		i += 2
	}
	name, j := ts.qualifiedName(i)
	if ts.seq(j, "rename", "to") {
		to, _ := ts.at(j + 2).name()
		s.indexTable[to] = s.indexTable[name]
		delete(s.indexTable, name)
		st.fresh[to] = st.fresh[name]
	}
}

// alterTable applies the constraint and rewrite rules to each action of an
// ALTER TABLE and follows renames.
func (s *schema) alterTable(st *fileState, ts tokens) []finding {
	i := 2
	if ts.seq(i, "if", "exists") {
		i += 2
	}
	if ts.at(i).is("only") {
		i++
	}
	table, i := ts.qualifiedName(i)
	if ts.at(i).kind == punct && ts.at(i).text == "*" {
		i++
	}
	if ts.seq(i, "rename", "to") {
		to, _ := ts.at(i + 2).name()
		if st.isHot(table) {
			st.hotAlias[to] = true
		}
		st.fresh[to] = st.fresh[table]
		s.partitioned[to] = s.partitioned[table]
		return nil
	}
	if st.fresh[table] {
		return nil
	}
	var out []finding
	for _, action := range ts[min(i, len(ts)):].splitTopLevel() {
		out = append(out, s.alterAction(st, table, action)...)
	}
	return out
}

func (s *schema) alterAction(st *fileState, table string, a tokens) []finding {
	hot := st.isHot(table)
	switch {
	case a.at(0).is("add") && a.at(1).is("constraint", "check", "foreign", "unique", "primary", "exclude"):
		return s.addConstraint(st, table, a)
	case a.at(0).is("add"):
		return addColumn(table, hot, a)
	case a.seq(0, "validate", "constraint"):
		name, _ := a.at(2).name()
		key := table + "." + name
		if c, ok := s.constraints[key]; ok {
			c.valid = true
		}
		if st.addedNotValid[key] && !st.file.NoTransaction {
			return []finding{{RuleNotValid, fmt.Sprintf("VALIDATE CONSTRAINT %s in the transaction that added it: the ADD's ACCESS EXCLUSIVE lock is held through the whole scan; validate it in a later migration", name)}}
		}
	case a.at(0).is("alter"):
		return s.alterColumn(table, hot, a)
	case hot && a.at(0).is("set") && (a.at(1).is("tablespace", "logged", "unlogged") || a.seq(1, "access", "method")):
		return []finding{{RuleNoRewrite, fmt.Sprintf("SET %s rewrites hot table %s under an ACCESS EXCLUSIVE lock", strings.ToUpper(a.at(1).text), table)}}
	}
	return nil
}

// addConstraint: ADD [CONSTRAINT name] {CHECK|FOREIGN KEY|UNIQUE|PRIMARY
// KEY|EXCLUDE} ... [NOT VALID].
func (s *schema) addConstraint(st *fileState, table string, a tokens) []finding {
	name := ""
	i := 1
	if a.at(1).is("constraint") {
		name, _ = a.at(2).name()
		i = 3
	}
	notValid := false
	for j := range a {
		if a.seq(j, "not", "valid") {
			notValid = true
		}
	}
	key := table + "." + name
	c := &constraint{table: table, valid: !notValid}
	if a.at(i).is("check") && a.at(i+1).text == "(" && a.seq(i+3, "is", "not", "null") && a.at(i+6).text == ")" {
		c.notNullColumn, _ = a.at(i + 2).name()
	}
	if name != "" {
		s.constraints[key] = c
	}
	if notValid {
		st.addedNotValid[key] = true
		return nil
	}
	switch {
	case a.at(i).is("check", "foreign"):
		kind := "CHECK"
		if a.at(i).is("foreign") {
			kind = "FOREIGN KEY"
		}
		return []finding{{RuleNotValid, fmt.Sprintf("ADD %s on existing table %s checks every row while it holds its lock: add it NOT VALID, then VALIDATE CONSTRAINT in a later migration", kind, table)}}
	case a.at(i).is("unique", "primary") && !a.has("using"):
		return []finding{{RuleNotValid, fmt.Sprintf("ADD %s on existing table %s builds its index under an ACCESS EXCLUSIVE lock: CREATE UNIQUE INDEX CONCURRENTLY first, then ADD ... USING INDEX", strings.ToUpper(a.at(i).text), table)}}
	case a.at(i).is("exclude"):
		return []finding{{RuleNotValid, fmt.Sprintf("ADD EXCLUDE on existing table %s builds its index and checks every row under an ACCESS EXCLUSIVE lock, and cannot be NOT VALID", table)}}
	}
	return nil
}

// volatileOK are the functions a column default may call and still be
// evaluated once for the existing rows (PostgreSQL 11+'s fast default);
// any other call may be volatile, which fills every row: a rewrite.
var volatileOK = map[string]bool{
	"now": true, "transaction_timestamp": true, "statement_timestamp": true, "current_timestamp": true,
	"current_date": true, "localtimestamp": true, "current_setting": true,
	"cast": true, "coalesce": true, "nullif": true, "greatest": true, "least": true, "row": true, "array": true,
}

// addColumn: ADD [COLUMN] [IF NOT EXISTS] name type [constraints].
func addColumn(table string, hot bool, a tokens) []finding {
	i := 1
	if a.at(i).is("column") {
		i++
	}
	if a.seq(i, "if", "not", "exists") {
		i += 3
	}
	column, _ := a.at(i).name()
	var out []finding
	if a.has("check") || a.has("references") || a.has("unique") || a.has("primary") {
		out = append(out, finding{RuleNotValid, fmt.Sprintf("a constraint added with column %s of existing table %s is checked (or its index built) at once under an ACCESS EXCLUSIVE lock: add the column, then the constraint NOT VALID", column, table)})
	}
	if !hot {
		return out
	}
	if a.at(i+1).is("serial", "serial2", "serial4", "serial8", "smallserial", "bigserial") {
		out = append(out, finding{RuleNoRewrite, fmt.Sprintf("%s column %s fills every row of hot table %s from a sequence: a rewrite", a.at(i+1).text, column, table)})
	}
	if a.has("generated") {
		out = append(out, finding{RuleNoRewrite, fmt.Sprintf("generated column %s computes every row of hot table %s: a rewrite", column, table)})
	}
	if f := volatileDefault(a); f != "" {
		out = append(out, finding{RuleNoRewrite, fmt.Sprintf("column %s's default calls %s(), which may be volatile: every existing row of hot table %s is written (a rewrite); add the column without it, SET DEFAULT, and backfill in batches", column, f, table)})
	}
	return out
}

// volatileDefault returns the first function a DEFAULT expression calls
// that is not known to be non-volatile.
func volatileDefault(a tokens) string {
	start := -1
	for i, t := range a {
		if t.is("default") {
			start = i + 1
			break
		}
	}
	if start < 0 {
		return ""
	}
	depth := 0
	for i := start; i < len(a); i++ {
		t := a[i]
		if t.kind == punct && t.text == "(" {
			depth++
		}
		if t.kind == punct && t.text == ")" {
			depth--
		}
		if depth == 0 && t.is("not", "null", "check", "references", "unique", "primary", "constraint", "generated", "collate") {
			return ""
		}
		if t.kind == word && a.at(i+1).text == "(" && !volatileOK[t.text] && a.at(i-1).text != "::" {
			return t.text
		}
	}
	return ""
}

// alterColumn: ALTER [COLUMN] name {[SET DATA] TYPE|SET NOT NULL|...} of
// an existing table.
func (s *schema) alterColumn(table string, hot bool, a tokens) []finding {
	i := 1
	if a.at(i).is("column") {
		i++
	}
	column, _ := a.at(i).name()
	i++
	switch {
	case hot && (a.at(i).is("type") || a.seq(i, "set", "data", "type")):
		return []finding{{RuleNoRewrite, fmt.Sprintf("changing the type of %s.%s rewrites hot table %s (and its indexes) under an ACCESS EXCLUSIVE lock: add a new column, backfill it in batches, switch over", table, column, table)}}
	case a.seq(i, "set", "not", "null"):
		for _, c := range s.constraints {
			if c.valid && c.table == table && c.notNullColumn == column {
				return nil
			}
		}
		// A NOT NULL constraint added with a scan: on a hot table the
		// issue's no-rewrite rule names it, elsewhere it is a constraint
		// added without NOT VALID.
		rule, what := RuleNotValid, "table"
		if hot {
			rule, what = RuleNoRewrite, "hot table"
		}
		return []finding{{rule, fmt.Sprintf("SET NOT NULL scans all of %s %s under an ACCESS EXCLUSIVE lock: add CHECK (%s IS NOT NULL) NOT VALID, VALIDATE it in a later migration, then SET NOT NULL (PostgreSQL skips the scan)", what, table, column)}}
	}
	return nil
}

// vacuumFull reports whether a VACUUM is FULL and which tables it names
// (none: the whole database).
func vacuumFull(ts tokens) (bool, []string) {
	full := false
	i := 1
	if ts.at(1).text == "(" {
		for i = 2; i < len(ts) && ts[i].text != ")"; i++ {
			if ts[i].is("full") && !ts.at(i+1).is("false", "off") && ts.at(i+1).text != "0" {
				full = true
			}
		}
		i++
	}
	for ts.at(i).is("full", "freeze", "verbose", "analyze") {
		full = full || ts.at(i).is("full")
		i++
	}
	var tables []string
	for _, part := range ts[min(i, len(ts)):].splitTopLevel() {
		if n, _ := part.qualifiedName(0); n != "" {
			tables = append(tables, n)
		}
	}
	return full, tables
}

// rewrites reports a whole-table rewrite of the hot tables among tables;
// no table means every table of the database.
func (st *fileState) rewrites(tables []string, what, instead string) []finding {
	if len(tables) == 0 {
		return []finding{{RuleNoRewrite, fmt.Sprintf("%s every table, hot ones included, each under an ACCESS EXCLUSIVE lock: %s", what, instead)}}
	}
	var out []finding
	for _, t := range tables {
		if st.isHot(t) {
			out = append(out, finding{RuleNoRewrite, fmt.Sprintf("%s hot table %s under an ACCESS EXCLUSIVE lock: %s", what, t, instead)})
		}
	}
	return out
}

// wholeTableWrite: UPDATE or DELETE of every row of a hot table in one
// statement writes a new version of every row and holds every row's lock
// until the migration commits, so every settle of those rows waits.
func (st *fileState) wholeTableWrite(ts tokens) []finding {
	i := 1
	if ts.at(0).is("delete") {
		i = 2 // DELETE FROM
	}
	if ts.at(i).is("only") {
		i++
	}
	table, _ := ts.qualifiedName(i)
	if !st.isHot(table) || ts.has("where") {
		return nil
	}
	return []finding{{RuleNoRewrite, fmt.Sprintf("%s of every row of hot table %s in one statement writes every row and holds every row's lock until commit: backfill in batches (WHERE on a key range), each its own transaction", strings.ToUpper(ts.at(0).text), table)}}
}

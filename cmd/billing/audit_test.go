package main

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"slices"
	"strings"
	"testing"

	"example.com/billing/internal/testenv/dbtest"
)

// auditOf runs billing audit --json against dsn.
func auditOf(t *testing.T, dsn string) auditListing {
	t.Helper()
	var listing auditListing
	out, err := runBilling(t, map[string]string{"DATABASE_URL": dsn}, "audit", "--json")
	if err != nil || json.Unmarshal([]byte(out), &listing) != nil {
		t.Fatalf("billing audit --json: %v\n%s", err, out)
	}
	return listing
}

// An import records who, why and what (the provider, the rows, the CSV's
// SHA-256) before it writes; when the record fails, it writes nothing.
func TestPaymentMethodsImport_RecordedFirst(t *testing.T) {
	db, dsn := dbtest.New(t)
	csv := "customer_id,customer_ref,payment_method_ref\n1,cus_1,pm_1\n2,cus_2,pm_2\n"
	env := map[string]string{"DATABASE_URL": dsn, "PAYMENT_PROVIDER": "stripe"}
	importCSV := func(args ...string) error {
		t.Helper()
		var stdout, stderr strings.Builder
		return run(t.Context(), append([]string{"billing", "payment-methods", "import"}, args...), env, strings.NewReader(csv), &stdout, &stderr)
	}
	if err := importCSV(); err == nil || !strings.Contains(err.Error(), "--reason is required") {
		t.Errorf("import without --reason: err = %v", err)
	}
	allow := refuseRecords(t, db)
	if err := importCSV("--reason", "CHG-7"); err == nil || !strings.Contains(err.Error(), "nothing imported") {
		t.Errorf("import with its record refused: err = %v", err)
	}
	allow()
	var n int
	if err := db.Get(&n, `SELECT count(*) FROM payment_method`); err != nil || n != 0 {
		t.Fatalf("%d payment methods written (%v) without a record, want none", n, err)
	}
	if err := importCSV("--reason", "CHG-7: cards of the migrated customers", "--by", "carol"); err != nil {
		t.Fatal(err)
	}
	actions := auditOf(t, dsn).Actions
	sum := sha256.Sum256([]byte(csv))
	var rec importRecord
	if len(actions) != 1 || json.Unmarshal(actions[0].Details, &rec) != nil || actions[0].By != "carol" || actions[0].Command != "payment-methods import" ||
		rec != (importRecord{Provider: "stripe", Rows: 2, SHA256: hex.EncodeToString(sum[:])}) {
		t.Errorf("billing audit lists %+v, want carol's import of 2 rows of this CSV", actions)
	}
}

// maintain with a retention shorter than its default needs a reason, and
// records the days it drops that the default keeps before it drops them.
func TestMaintain_EarlyDropsAreRecorded(t *testing.T) {
	_, dsn := dbtest.New(t)
	// The schema's processed_event starts 7 days back: with 48h, days the
	// default 168h keeps are dropped.
	env := map[string]string{"DATABASE_URL": dsn, "DEDUP_RETENTION": "48h"}
	if _, err := runBilling(t, env, "maintain"); err == nil || !strings.Contains(err.Error(), "--reason is required") || !strings.Contains(err.Error(), "drops records early") {
		t.Errorf("maintain with DEDUP_RETENTION=48h and no reason: err = %v", err)
	}
	if n := len(auditOf(t, dsn).Actions); n != 0 {
		t.Fatalf("%d actions recorded by a refused maintain", n)
	}
	out, err := runBilling(t, env, "maintain", "--reason", "INC-9: the disk fills; keep two days", "--by", "dave")
	if err != nil {
		t.Fatalf("maintain: %v", err)
	}
	var rep struct {
		Dropped []string `json:"dropped"`
	}
	if err := json.Unmarshal([]byte(out), &rep); err != nil || len(rep.Dropped) == 0 {
		t.Fatalf("maintain dropped nothing: %v\n%s", err, out)
	}
	actions := auditOf(t, dsn).Actions
	var plan earlyDrops
	if len(actions) != 1 || json.Unmarshal(actions[0].Details, &plan) != nil || actions[0].By != "dave" || actions[0].Command != "maintain" {
		t.Fatalf("billing audit lists %+v, want dave's maintain", actions)
	}
	for _, name := range rep.Dropped {
		if !slices.Contains(plan.Partitions, name) {
			t.Errorf("maintain dropped %s, which its record %v does not name", name, plan.Partitions)
		}
	}
	// Nothing more to drop early: the next run records nothing.
	if _, err := runBilling(t, env, "maintain", "--reason", "INC-9: the disk fills; keep two days"); err != nil {
		t.Fatal(err)
	}
	if n := len(auditOf(t, dsn).Actions); n != 1 {
		t.Errorf("%d actions after a run that dropped nothing early, want 1", n)
	}
	// At the default retention no reason is needed.
	if _, err := runBilling(t, map[string]string{"DATABASE_URL": dsn}, "maintain"); err != nil {
		t.Errorf("maintain at the default retention: %v", err)
	}
}

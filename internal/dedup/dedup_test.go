package dedup_test

import (
	"context"
	"crypto/sha256"
	"io"
	"log/slog"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/gofrs/uuid/v5"
	"github.com/jmoiron/sqlx"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"example.com/billing/internal/daytable"
	"example.com/billing/internal/dedup"
	"example.com/billing/internal/lease"
	"example.com/billing/internal/metrics"
	"example.com/billing/internal/postgres"
	"example.com/billing/internal/testenv/dbtest"
)

func idAt(t *testing.T, at time.Time) uuid.UUID {
	t.Helper()
	id, err := uuid.NewV7AtTime(at)
	if err != nil {
		t.Fatal(err)
	}
	return id
}

func entry(t *testing.T, at time.Time, payload string) dedup.Entry {
	t.Helper()
	return dedup.Entry{ID: idAt(t, at), Fingerprint: sha256.Sum256([]byte(payload))}
}

func claim(t *testing.T, db *sqlx.DB, s *dedup.Store, entries ...dedup.Entry) []dedup.Verdict {
	t.Helper()
	var v []dedup.Verdict
	err := postgres.InTx(context.Background(), db, func(tx *sqlx.Tx) error {
		var err error
		v, err = s.Claim(context.Background(), tx, entries)
		return err
	})
	if err != nil {
		t.Fatalf("claim: %v", err)
	}
	return v
}

func TestClaim(t *testing.T) {
	db, _ := dbtest.New(t)
	s := dedup.NewStore("g1")
	now := time.Now()
	a, b := entry(t, now, "a"), entry(t, now, "b")
	tampered := a
	tampered.Fingerprint = sha256.Sum256([]byte("a, altered"))

	steps := []struct {
		name    string
		entries []dedup.Entry
		want    []dedup.Verdict
	}{
		{"OK_FirstTime", []dedup.Entry{a}, []dedup.Verdict{dedup.First}},
		{"OK_Duplicate", []dedup.Entry{a}, []dedup.Verdict{dedup.Seen}},
		{"OK_MixedBatch", []dedup.Entry{a, b}, []dedup.Verdict{dedup.Seen, dedup.First}},
		{"ErrMismatch_SameIDOtherPayload", []dedup.Entry{tampered}, []dedup.Verdict{dedup.Mismatch}},
	}
	for _, st := range steps {
		t.Run(st.name, func(t *testing.T) {
			if got := claim(t, db, s, st.entries...); !slices.Equal(got, st.want) {
				t.Errorf("verdicts %v, want %v", got, st.want)
			}
		})
	}

	t.Run("OK_CopiesInOneBatch", func(t *testing.T) {
		c := entry(t, now, "c")
		cAltered := c
		cAltered.Fingerprint = sha256.Sum256([]byte("c2"))
		got := claim(t, db, s, c, c, cAltered)
		want := []dedup.Verdict{dedup.First, dedup.Seen, dedup.Mismatch}
		if !slices.Equal(got, want) {
			t.Errorf("verdicts %v, want %v", got, want)
		}
	})

	t.Run("OK_CopiesOfARecordedEventAreJudgedAgainstTheRecord", func(t *testing.T) {
		// a was recorded above; a batch holds two tampered copies and then
		// a true one: every tampered copy is a mismatch, the true one a
		// duplicate, whatever their order.
		got := claim(t, db, s, tampered, tampered, a)
		want := []dedup.Verdict{dedup.Mismatch, dedup.Mismatch, dedup.Seen}
		if !slices.Equal(got, want) {
			t.Errorf("verdicts %v, want %v", got, want)
		}
	})

	t.Run("OK_GroupsAreIndependent", func(t *testing.T) {
		if got := claim(t, db, dedup.NewStore("g2"), a); got[0] != dedup.First {
			t.Errorf("another group's first claim: %v", got[0])
		}
	})

	t.Run("OK_RolledBackClaimIsForgotten", func(t *testing.T) {
		d := entry(t, now, "d")
		_ = postgres.InTx(context.Background(), db, func(tx *sqlx.Tx) error {
			if _, err := s.Claim(context.Background(), tx, []dedup.Entry{d}); err != nil {
				return err
			}
			return io.EOF // the charge failed: roll back
		})
		if got := claim(t, db, s, d); got[0] != dedup.First {
			t.Errorf("after rollback: %v, want first", got[0])
		}
	})
}

func TestClaim_LateDuplicateOfAnOldDayIsDetected(t *testing.T) {
	db, _ := dbtest.New(t)
	s := dedup.NewStore("g")
	old := entry(t, time.Now().Add(-6*24*time.Hour), "six days ago")
	claim(t, db, s, old)
	// Rows written since, and a day rolled over: the seed's DDL, keyed by
	// processed_at, would put this copy in today's partition and miss it.
	claim(t, db, s, entry(t, time.Now(), "today"))
	if got := claim(t, db, s, old); got[0] != dedup.Seen {
		t.Errorf("late copy of a six-day-old event: %v, want duplicate", got[0])
	}
	var stored string
	if err := db.Get(&stored, `SELECT tableoid::regclass::text FROM processed_event WHERE event_id = $1`, old.ID); err != nil {
		t.Fatal(err)
	}
	if want := "processed_event_p" + daytable.Day(old.ID).Format("20060102"); stored != want {
		t.Errorf("stored in %s, want %s", stored, want)
	}
}

func TestClaim_RacingDuplicateWaitsAndSkips(t *testing.T) {
	db, _ := dbtest.New(t)
	s := dedup.NewStore("g")
	e := entry(t, time.Now(), "race")

	// The first transaction claims and holds; the second must wait on the
	// primary key, then see a duplicate once the first commits.
	held := make(chan struct{})
	release := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		_ = postgres.InTx(context.Background(), db, func(tx *sqlx.Tx) error {
			if _, err := s.Claim(context.Background(), tx, []dedup.Entry{e}); err != nil {
				t.Error(err)
			}
			close(held)
			<-release
			return nil
		})
	})
	<-held
	second := make(chan dedup.Verdict, 1)
	wg.Go(func() { second <- claim(t, db, s, e)[0] })
	select {
	case v := <-second:
		t.Fatalf("second claim did not wait for the first transaction: %v", v)
	case <-time.After(300 * time.Millisecond):
	}
	close(release)
	if v := <-second; v != dedup.Seen {
		t.Errorf("second claim: %v, want duplicate", v)
	}
	wg.Wait()
}

func TestRetention(t *testing.T) {
	db, _ := dbtest.New(t)
	m := metrics.New(prometheus.NewRegistry())
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	s := dedup.NewStore("g")
	now := time.Now().UTC()
	day := 24 * time.Hour

	// Old days with rows: as if the service had run for three weeks.
	for _, age := range []int{20, 9, 8, 7, 6} {
		at := now.Add(-time.Duration(age) * day)
		if err := dedup.Table.EnsureFor(context.Background(), db, []uuid.UUID{idAt(t, at)}); err != nil {
			t.Fatal(err)
		}
	}
	keep := []dedup.Entry{entry(t, now.Add(-6*day), "6d"), entry(t, now.Add(-day), "1d"), entry(t, now, "now")}
	expire := []dedup.Entry{entry(t, now.Add(-20*day), "20d"), entry(t, now.Add(-8*day-time.Hour), "8d")}
	claim(t, db, s, append(slices.Clone(keep), expire...)...)

	r := dedup.NewRetention(db, 7*day, 3, m, log)
	rep, err := r.Run(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if rep.Skipped {
		t.Fatal("skipped with no other maintainer")
	}

	names := partitionNames(t, db)
	horizon := now.Add(-7 * day)
	for _, n := range names {
		d, _ := time.Parse("20060102", n[len("processed_event_p"):])
		if !d.Add(day).After(horizon) {
			t.Errorf("partition %s is wholly older than the horizon %s and was kept", n, horizon)
		}
	}
	for d := horizon.Truncate(day); !d.After(now.Truncate(day).Add(3 * day)); d = d.Add(day) {
		if !slices.Contains(names, "processed_event_p"+d.Format("20060102")) {
			t.Errorf("partition of %s missing", d.Format(time.DateOnly))
		}
	}
	// The partition that straddles the horizon stays: dropping it would
	// forget events that are still within the retention.
	if !slices.Contains(names, "processed_event_p"+horizon.Format("20060102")) {
		t.Errorf("the horizon's own day was dropped")
	}
	for _, e := range keep {
		if got := claim(t, db, s, e); got[0] != dedup.Seen {
			t.Errorf("event within retention forgotten: %v", got[0])
		}
	}
	var left int
	if err := db.Get(&left, `SELECT count(*) FROM processed_event`); err != nil {
		t.Fatal(err)
	}
	if left != len(keep) {
		t.Errorf("%d rows left, want %d", left, len(keep))
	}
	if len(rep.Dropped) < 2 || testutil.ToFloat64(m.DedupPartitionsDropped) != float64(len(rep.Dropped)) {
		t.Errorf("dropped %v, metric %v", rep.Dropped, testutil.ToFloat64(m.DedupPartitionsDropped))
	}
	if got := testutil.ToFloat64(m.DedupPartitions); got != float64(len(names)) {
		t.Errorf("partitions metric %v, want %d", got, len(names))
	}
	if age := testutil.ToFloat64(m.DedupOldestPartitionAge); age < (7*day).Seconds() || age > (8*day).Seconds() {
		t.Errorf("oldest partition age %v s, want about 7 days", age)
	}

	// A second run has nothing to do.
	rep, err = r.Run(context.Background())
	if err != nil || len(rep.Created)+len(rep.Dropped) != 0 {
		t.Errorf("second run: %+v, %v; want no change", rep, err)
	}
}

func TestRetention_OneMaintainerAtATime(t *testing.T) {
	db, _ := dbtest.New(t)
	m := metrics.New(prometheus.NewRegistry())
	log := slog.New(slog.NewTextHandler(io.Discard, nil))

	// Another replica holds the maintenance lease: this one skips, and
	// names it.
	other := lease.New(db, lease.DedupRetention, time.Minute)
	err := other.Do(context.Background(), func(context.Context, lease.Tenure) error {
		rep, err := dedup.NewRetention(db, 7*24*time.Hour, 3, m, log).Run(context.Background())
		if err != nil || !rep.Skipped || rep.HeldBy != other.Holder() {
			t.Errorf("with the lease held elsewhere: %+v, %v; want skipped, held by %s", rep, err, other.Holder())
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}

	// Many at once: none fails, and the result is as if one ran.
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for range 8 {
		wg.Go(func() {
			_, err := dedup.NewRetention(db, 7*24*time.Hour, 3, m, log).Run(context.Background())
			errs <- err
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Errorf("concurrent maintainer: %v", err)
		}
	}
	if n := len(partitionNames(t, db)); n < 11 {
		t.Errorf("%d partitions, want at least 11 (7 days back, today, 3 ahead)", n)
	}
}

func partitionNames(t *testing.T, db *sqlx.DB) []string {
	t.Helper()
	var names []string
	if err := db.Select(&names, `SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
		WHERE i.inhparent = 'processed_event'::regclass ORDER BY 1`); err != nil {
		t.Fatal(err)
	}
	return names
}

func TestRetention_ADroppedDayIsNeverRecreated(t *testing.T) {
	db, _ := dbtest.New(t)
	m := metrics.New(prometheus.NewRegistry())
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	now := time.Now().UTC()
	old := idAt(t, now.Add(-5*24*time.Hour))
	if err := dedup.Table.EnsureFor(context.Background(), db, []uuid.UUID{old}); err != nil {
		t.Fatal(err)
	}

	// A maintainer keeping 3 days drops the day 5 days ago...
	if _, err := dedup.NewRetention(db, 3*24*time.Hour, 3, m, log).Run(context.Background()); err != nil {
		t.Fatal(err)
	}
	before, err := dedup.DroppedBefore(context.Background(), db)
	if err != nil {
		t.Fatal(err)
	}
	if want := now.Add(-3 * 24 * time.Hour).Truncate(24 * time.Hour); !before.Equal(want) {
		t.Fatalf("dropped_before = %s, want %s", before, want)
	}
	// ...and one keeping 30 days (an operator raised DEDUP_RETENTION) must
	// not bring it back empty: its events would look new.
	if _, err := dedup.NewRetention(db, 30*24*time.Hour, 3, m, log).Run(context.Background()); err != nil {
		t.Fatal(err)
	}
	name := "processed_event_p" + daytable.Day(old).Format("20060102")
	if slices.Contains(partitionNames(t, db), name) {
		t.Errorf("%s was recreated after it was dropped", name)
	}
}

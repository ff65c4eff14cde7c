package daytable_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"example.com/billing/internal/daytable"
	"example.com/billing/internal/testenv/dbtest"
)

// Writers and maintainers creating the same day at once all succeed: a
// backlog of old events has several writers meet the same missing day,
// while serve's maintenance and the maintain CronJob create days too.
// Concurrent CREATE TABLEs of one name used to race in the catalog, and all
// but one failed (23505 on pg_type's unique index, or "already exists").
func TestEnsure_ManyCreatorsOfOneDayAllSucceed(t *testing.T) {
	db, _ := dbtest.New(t)
	for _, table := range []daytable.Table{"processed_event", "outbox"} {
		t.Run(string(table), func(t *testing.T) {
			for round := range 5 {
				day := time.Now().UTC().Truncate(24*time.Hour).AddDate(0, 0, 10+round)
				const creators = 16
				start := make(chan struct{})
				errs := make(chan error, creators)
				var wg sync.WaitGroup
				for range creators {
					wg.Go(func() {
						<-start
						errs <- table.Ensure(context.Background(), db, day)
					})
				}
				close(start)
				wg.Wait()
				close(errs)
				for err := range errs {
					if err != nil {
						t.Errorf("day %s: %v", day.Format(time.DateOnly), err)
					}
				}
				parts, err := table.List(context.Background(), db)
				if err != nil {
					t.Fatal(err)
				}
				if _, ok := parts[table.Name(day)]; !ok {
					t.Errorf("no partition %s after %d creators", table.Name(day), creators)
				}
			}
		})
	}
}

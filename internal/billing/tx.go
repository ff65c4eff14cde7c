package billing

// This file is every phase's transaction (claim, settle, recovery): traced
// below the events it serves, timed in billing_db_transaction_seconds,
// watched for a database that refuses writes, and the one place where a
// row that finds no partition for its day is healed: the day's partitions
// are created and the business transaction runs once more.

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/gofrs/uuid/v5"
	"github.com/jmoiron/sqlx"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"
	"go.opentelemetry.io/otel/trace"

	"example.com/billing/internal/daytable"
	"example.com/billing/internal/dedup"
	"example.com/billing/internal/postgres"
)

// inTx runs fn in a transaction of phase, traced below the events' spans and
// timed in billing_db_transaction_seconds. When a row fell on a day whose
// partition does not exist (maintenance has not run; a late event), it
// creates the partitions and runs fn once more: every write of the
// pipeline heals that one way.
func (s *settler) inTx(ctx context.Context, phase string, spans []trace.SpanContext, fn func(tx *sqlx.Tx) error) error {
	err := s.tx(ctx, phase, spans, fn)
	var missing *daytable.MissingError
	if !errors.As(err, &missing) {
		return err
	}
	if err := s.createPartitions(ctx, missing); err != nil {
		return err
	}
	return s.tx(ctx, phase, spans, fn)
}

// createPartitions creates the partitions missing's rows need. A day of
// processed_event that retention dropped is not created again: an event of
// that day could be a duplicate whose record is gone, and the claim parks
// it (droppedError).
func (s *settler) createPartitions(ctx context.Context, missing *daytable.MissingError) error {
	ids := missing.IDs
	if missing.Table == dedup.Table {
		droppedBefore, err := dedup.DroppedBefore(ctx, s.db)
		if err != nil {
			return err
		}
		dropped := &droppedError{before: droppedBefore}
		ids = slices.DeleteFunc(slices.Clone(ids), func(id uuid.UUID) bool {
			if daytable.Day(id).Before(droppedBefore) {
				dropped.ids = append(dropped.ids, id)
				return true
			}
			return false
		})
		if len(dropped.ids) > 0 {
			return dropped
		}
	}
	s.log.Warn("a table has no partition for a row's day; creating it (is `billing maintain` running?)", "table", missing.Table)
	return missing.Table.EnsureFor(ctx, s.db, ids)
}

// droppedError: events fall on days whose dedup records retention dropped.
type droppedError struct {
	ids    []uuid.UUID
	before time.Time // the store remembers from this day on
}

func (e *droppedError) Error() string {
	return fmt.Sprintf("%d events fall on days whose dedup records were dropped (before %s)", len(e.ids), e.before.Format(time.DateOnly))
}

// tx runs fn in one transaction of phase, traced and timed.
func (s *settler) tx(ctx context.Context, phase string, spans []trace.SpanContext, fn func(tx *sqlx.Tx) error) error {
	links := make([]trace.Link, 0, len(spans))
	for _, sc := range spans {
		links = append(links, trace.Link{SpanContext: sc})
	}
	var parent trace.SpanContext
	if len(spans) > 0 {
		parent = spans[0]
	}
	// One transaction serves many events: its span hangs below the first
	// one's and links to all of them.
	ctx, span := s.tracer.Start(trace.ContextWithSpanContext(ctx, parent), "billing "+phase,
		trace.WithSpanKind(trace.SpanKindClient), trace.WithLinks(links...),
		trace.WithAttributes(semconv.DBSystemNamePostgreSQL, attribute.Int("billing.events", len(spans))))
	defer span.End()
	started := time.Now()
	err := postgres.InTx(ctx, s.db, fn)
	s.metrics.Transaction.WithLabelValues(phase).Observe(time.Since(started).Seconds())
	s.writes.Observe(err)
	if err != nil {
		s.metrics.DBErrors.WithLabelValues(postgres.SQLState(err)).Inc()
		span.RecordError(err)
		span.SetStatus(codes.Error, "rolled back")
	}
	return err
}

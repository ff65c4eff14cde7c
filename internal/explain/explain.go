// Package explain tells one order event's whole story, or every event of an
// order, from what billing recorded and what Kafka holds (billing explain):
// where the event was read (topic, partition, offset, when), its claim in
// the dedup store, its charge attempt with the provider's answers and ids,
// its payment outcome event (recorded, published: found on the outcome
// topic), its parkings in the dead-letter topic and the replays that
// republished it, the provider's notifications of its payment, and the
// operator actions on it. It only reads.
//
// billing stores no offsets: the event is found on the topics by time. Its
// UUID v7 id holds when it was created, the claim when billing took it, the
// settle when its outcome was recorded; ListOffsets turns each time into
// an offset per partition, and a bounded read from there looks for the
// event id (search.go). Every read is bounded by time and by messages, and
// the story says what each search covered and when it found nothing within
// its bounds.
package explain

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/IBM/sarama"
	"github.com/gofrs/uuid/v5"
	"github.com/jmoiron/sqlx"

	"example.com/billing/internal/audit"
	"example.com/billing/internal/charge"
	"example.com/billing/internal/order"
)

// Story is what billing explain tells about a subject: an event, or an
// order and each of its events.
type Story struct {
	// Subject is what was asked about: an event id, or an order id.
	Subject string `json:"subject"`
	// OrderID is the order's id, when the subject is an order or the
	// event's order is known.
	OrderID int64   `json:"orderId,omitempty"`
	Events  []Event `json:"events"`
	// Actions are the operator actions on the subject, its events and its
	// order, and the replays that republished its events, oldest first.
	Actions []audit.Action `json:"operatorActions"`
	// Searches are the Kafka searches made, with their bounds and what
	// they found.
	Searches []Search `json:"searches"`
	// Notes say what could not be looked at, and why.
	Notes []string `json:"notes,omitempty"`
}

// Event is one order event's story.
type Event struct {
	EventID uuid.UUID `json:"eventId"`
	// Created is the time in the event's UUID v7 id, when it has one.
	Created *time.Time `json:"created,omitempty"`
	// Summary says in one line what became of the event.
	Summary string `json:"summary"`
	// Reads are the copies of the event found on the order topic, first
	// delivery, duplicates and replays, in offset order.
	Reads []Read `json:"reads"`
	// Claims are its records in the dedup store, one per consumer group.
	Claims []Claim `json:"claims"`
	// Attempt is its charge attempt, nil when it has none (a duplicate
	// of a charged order, an event parked before its attempt, one that
	// waits).
	Attempt *Attempt `json:"attempt,omitempty"`
	// Waiting is its record in charge_waiting: it waits for its order's
	// payment in progress.
	Waiting *Waiting `json:"waiting,omitempty"`
	// Outcomes are its payment outcome events: published (found on the
	// outcome topic), waiting in the outbox, or dead.
	Outcomes []Outcome `json:"outcomes"`
	// Parkings are its copies in the dead-letter topic.
	Parkings []Parking `json:"parkings"`
	// Notified are the provider's notifications of its payment that
	// billing kept (Adyen).
	Notified []Notified `json:"notified,omitempty"`
	// ChargedBy is, for an event whose order another event charged, that
	// event's id.
	ChargedBy *uuid.UUID `json:"chargedBy,omitempty"`
}

// Read is a copy of an event on a topic.
type Read struct {
	Topic     string    `json:"topic"`
	Partition int32     `json:"partition"`
	Offset    int64     `json:"offset"`
	Timestamp time.Time `json:"timestamp"`
	Key       string    `json:"key"`
	// OrderID is the order the copy's value names, 0 when it does not
	// decode (an invalid event).
	OrderID int64 `json:"orderId,omitempty"`
	// ReplayedFrom is x-dlq-replayed-from: the dead-letter partition and
	// offset a replay republished it from; "" for a first delivery.
	ReplayedFrom string `json:"replayedFrom,omitempty"`
	// ReplayAction is the operator action of that replay, 0 for none.
	ReplayAction int64 `json:"replayAction,omitempty"`
}

// Claim is an event's record in processed_event.
type Claim struct {
	Group       string    `db:"consumer_group" json:"group"`
	ProcessedAt time.Time `db:"processed_at" json:"processedAt"`
	ClaimedWith int       `db:"claimed_with" json:"claimedWith"`
}

// Attempt is an event's charge attempt, every column of it.
type Attempt struct {
	OrderID          int64      `json:"orderId"`
	CustomerID       int64      `json:"customerId"`
	Amount           string     `json:"amount"`
	Currency         string     `json:"currency"`
	Status           string     `json:"status"`
	ProviderChargeID string     `json:"providerChargeId,omitempty"`
	Requests         int        `json:"requests"`
	LastError        string     `json:"lastError,omitempty"`
	DeclineCode      string     `json:"declineCode,omitempty"`
	Deferred         bool       `json:"deferred"`
	Indeterminate    int        `json:"indeterminate"`
	CustomerRef      string     `json:"customerRef,omitempty"`
	PaymentMethodRef string     `json:"paymentMethodRef,omitempty"`
	CreatedAt        time.Time  `json:"createdAt"`
	UpdatedAt        time.Time  `json:"updatedAt"`
	SettledAt        *time.Time `json:"settledAt,omitempty"`
	ResolveAt        *time.Time `json:"resolveAt,omitempty"`
	CountedBy        string     `json:"countedBy,omitempty"`
}

// Waiting is an event's record in charge_waiting.
type Waiting struct {
	OrderID   int64     `json:"orderId"`
	CreatedAt time.Time `json:"createdAt"`
}

// Outcome is one payment outcome event of an event.
type Outcome struct {
	EventID     uuid.UUID `json:"eventId"`
	Type        string    `json:"eventType"`
	OccurredAt  time.Time `json:"occurredAt"`
	Reason      string    `json:"reason,omitempty"`
	ProviderID  string    `json:"providerChargeId,omitempty"`
	DeclineCode string    `json:"declineCode,omitempty"`
	// State is "published" (found on the outcome topic: Read says where),
	// "outbox" (recorded, not published yet: Attempts and LastError say
	// how the relay fares) or "dead" (could never be published).
	State     string `json:"state"`
	Read      *Read  `json:"read,omitempty"`
	Attempts  int    `json:"attempts,omitempty"`
	LastError string `json:"lastError,omitempty"`
}

// Outcome states.
const (
	Published = "published"
	InOutbox  = "outbox"
	Dead      = "dead"
)

// Parking is a copy of an event in the dead-letter topic.
type Parking struct {
	Read
	// Reason is x-dlq-reason: its code, ": ", the rule that failed.
	Reason string `json:"reason"`
	// Original is where the parked message was read (x-original-*), and
	// Group which consumer group parked it.
	Original string `json:"original"`
	Group    string `json:"group"`
}

// Notified is one of the provider's notifications billing kept.
type Notified struct {
	PaymentRef string    `json:"paymentRef"`
	Status     string    `json:"status"`
	Amount     string    `json:"amount"`
	CreatedAt  time.Time `json:"createdAt"`
	ReceivedAt time.Time `json:"receivedAt"`
}

// Topics are the topics searched: the order topic, its dead-letter topic
// and the outcome topic.
type Topics struct {
	Orders, DLQ, Outcomes string
}

// Limits bound the Kafka searches.
type Limits struct {
	// Messages is the most messages one search reads, all its partitions
	// together.
	Messages int
	// Timeout bounds all the searches of a story together; what is left
	// unsearched then is said.
	Timeout time.Duration
	// Declined is how far back an order's declined and rejected attempts
	// are looked for (its succeeded and open ones always are): the charge
	// table has no index by order for them, and its creation times one
	// (BRIN) that makes a window cheap.
	Declined time.Duration
}

// Teller tells stories from db and, when kafka is not nil, the topics.
type Teller struct {
	db       *sqlx.DB
	kafka    sarama.Client
	topics   Topics
	provider string // PAYMENT_PROVIDER: whose notifications were kept
	limits   Limits
}

// NewTeller returns a Teller that reads db and, with client not nil, the
// topics; provider is PAYMENT_PROVIDER.
func NewTeller(db *sqlx.DB, client sarama.Client, topics Topics, provider string, limits Limits) *Teller {
	return &Teller{db: db, kafka: client, topics: topics, provider: provider, limits: limits}
}

// ErrNotSubject: what was asked about is neither an event id nor an
// order id.
var ErrNotSubject = errors.New("not an event id (a UUID) or an order id (a positive integer)")

// Tell tells the story of subject: an event id, or an order id.
func (t *Teller) Tell(ctx context.Context, subject string) (Story, error) {
	st := Story{Subject: subject, Events: []Event{}, Actions: []audit.Action{}, Searches: []Search{}}
	var ids []uuid.UUID
	if id, err := uuid.FromString(subject); err == nil {
		ids = []uuid.UUID{id}
	} else if n, err := strconv.ParseInt(subject, 10, 64); err == nil && n > 0 {
		st.OrderID = n
	} else {
		return st, fmt.Errorf("%q: %w", subject, ErrNotSubject)
	}
	rec, err := t.records(ctx, ids, st.OrderID)
	if err != nil {
		return st, err
	}
	if st.OrderID == 0 {
		st.OrderID = rec.orderOf(ids[0])
	}
	if len(ids) == 0 {
		ids = rec.eventIDs()
		if len(ids) == 0 {
			st.Notes = append(st.Notes, fmt.Sprintf("billing recorded no attempt or waiting event of order %d (declined and rejected attempts looked for since %s); an event of it that was parked before its claim or that was a duplicate of a charged one names no order in the database: explain it by its event id",
				st.OrderID, rec.declinedSince.Format(time.RFC3339)))
		}
	}
	for _, id := range ids {
		st.Events = append(st.Events, rec.event(id))
	}
	if t.kafka == nil {
		st.Notes = append(st.Notes, "Kafka was not searched: where the events were read, their parkings, replays and published outcomes are not shown")
	} else {
		t.search(ctx, &st, rec)
	}
	if err := t.finish(ctx, &st, rec); err != nil {
		return st, err
	}
	return st, nil
}

// finish adds what the searches made known: the operator actions (on the
// events, the order, and those the reads name), the charge of an order
// another event paid, and each event's summary.
func (t *Teller) finish(ctx context.Context, st *Story, rec *records) error {
	subjects := []string{st.Subject}
	for i := range st.Events {
		ev := &st.Events[i]
		subjects = append(subjects, ev.EventID.String())
		if st.OrderID == 0 {
			st.OrderID = orderOfReads(ev)
		}
	}
	if st.OrderID != 0 {
		subjects = append(subjects, strconv.FormatInt(st.OrderID, 10))
	}
	actions, err := audit.About(ctx, t.db, slices.Compact(slices.Sorted(slices.Values(subjects))))
	if err != nil {
		return err
	}
	var named []int64
	for _, ev := range st.Events {
		for _, r := range ev.Reads {
			if r.ReplayAction != 0 {
				named = append(named, r.ReplayAction)
			}
		}
	}
	if len(named) > 0 {
		more, err := audit.Get(ctx, t.db, named)
		if err != nil {
			return err
		}
		actions = append(actions, more...)
	}
	slices.SortFunc(actions, func(a, b audit.Action) int { return cmp.Compare(a.ID, b.ID) })
	st.Actions = slices.CompactFunc(actions, func(a, b audit.Action) bool { return a.ID == b.ID })

	var paid *charge.Row
	if st.OrderID != 0 {
		if paid, err = succeededOf(ctx, t.db, st.OrderID); err != nil {
			return err
		}
	}
	for i := range st.Events {
		ev := &st.Events[i]
		if paid != nil && paid.EventID != ev.EventID && ev.Attempt == nil {
			ev.ChargedBy = &paid.EventID
		}
		ev.Summary = summary(ev, rec.horizon)
	}
	return nil
}

// orderOfReads is the order id of the first copy of ev that decodes, 0
// when none does.
func orderOfReads(ev *Event) int64 {
	for _, r := range ev.Reads {
		if r.OrderID != 0 {
			return r.OrderID
		}
	}
	for _, p := range ev.Parkings {
		if p.OrderID != 0 {
			return p.OrderID
		}
	}
	return 0
}

// created is the time in id, when it is a UUID v7.
func created(id uuid.UUID) *time.Time {
	at := order.Event{ID: id}.IDTime()
	if at.IsZero() {
		return nil
	}
	return &at
}

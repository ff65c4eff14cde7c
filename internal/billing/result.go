package billing

import (
	"fmt"

	"go.opentelemetry.io/otel/trace"

	"example.com/billing/internal/dlq/reason"
	"example.com/billing/internal/metrics"
	"example.com/billing/internal/order"
)

// Outcome is what became of one message. Charged and Declined are reported
// once per settled attempt, for the message whose try recorded it as
// counted (charge.counted_by); other copies of the event are Duplicates.
type Outcome int

const (
	// Pending: not finished; the message must be retried and its offset must
	// not be marked.
	Pending Outcome = iota
	// Charged: the provider charged the order and the charge was recorded.
	Charged
	// Duplicate: the event was already processed by this consumer group.
	Duplicate
	// AlreadyCharged: a different event for an order that already has a
	// succeeded charge; recorded as processed, not charged.
	AlreadyCharged
	// Declined: the provider declined the payment; recorded, not retried.
	Declined
	// Parked: the event cannot be processed as it is and belongs in the
	// dead-letter topic; Result.Reason says why. Its metric label is the
	// contract's "invalid", whatever the reason (stale, mismatched and
	// provider-rejected events too), counted by the dead-letter writer
	// once parked; billing_dlq_messages_total{reason} tells them apart.
	Parked
	// InProgress: the message is finished, its outcome decided later: the
	// provider holds its payment without a verdict (in_progress), or the
	// event waits for another attempt of its order that the provider
	// holds. The settle that records the outcome counts it (charge.deferred).
	InProgress
)

// String returns the outcome's metric label.
func (o Outcome) String() string {
	switch o {
	case Pending:
		return "pending"
	case Charged:
		return metrics.OutcomeCharged
	case Duplicate:
		return metrics.OutcomeDuplicate
	case AlreadyCharged:
		return metrics.OutcomeAlreadyCharged
	case Declined:
		return metrics.OutcomeDeclined
	case Parked:
		return metrics.OutcomeInvalid
	case InProgress:
		return "in_progress"
	}
	return fmt.Sprintf("Outcome(%d)", int(o))
}

// Result is the fate of one event.
type Result struct {
	Outcome Outcome
	// Reason, for Parked: its code and the rule that failed, for a human.
	Reason reason.Reason
	Event  order.Event
	// Recorded is, for a Duplicate, what the charge table holds for the
	// event itself (Charged, Declined), or Pending when it holds nothing.
	Recorded Outcome

	trace trace.SpanContext
	// counter is what charge.counted_by holds when this message's try
	// counts the event's outcome (see Processor.counter).
	counter string
}

// announced reports whether r is an event parked for a reason of its own
// (stale-event, payload-mismatch, no-payment-method), whose
// payment.failed.v1 outcome the claim records so that the order service
// does not wait for it for ever (a provider-rejected one's is recorded by
// its settle).
func (r Result) announced() bool {
	switch r.Reason.Code {
	case reason.StaleEvent, reason.PayloadMismatch, reason.NoPaymentMethod:
		return r.Outcome == Parked
	}
	return false
}

func (r *Result) park(code reason.Code, detail string) {
	r.Outcome, r.Reason = Parked, reason.Reason{Code: code, Detail: detail}
}

// Package loadgen generates order.confirmed.v1 traffic for billing: valid
// events, exact re-sends of them (duplicates) and values the decoder must
// reject (invalid), mixed in one stream, and publishes it to Kafka.
//
// The demo, `billing produce`, benchmarks and the chaos suite all use it, so
// that they send the same mix; and it records what it generated as an
// [Expected], the truth a test checks the service against: which valid
// events exist (order, customer, amount, currency), how many messages are
// duplicates and how many are invalid.
//
// Every message's key is its order id as a decimal string, as in
// production. Each fresh message (valid or invalid) gets the next order id,
// so no two distinct events confirm the same order: every valid event is
// charged (or declined) exactly once, every duplicate is skipped, every
// invalid message is dead-lettered.
//
// With the same Options (Seed included), a Generator produces the same
// sequence of kinds, keys, customers, amounts, currencies and defects; event
// ids are fresh UUID v7s and occurredAt is the time of generation, so the
// bytes differ between runs.
package loadgen

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/gofrs/uuid/v5"

	"example.com/billing/internal/order"
)

// DefaultCurrencies is the currency mix when Options.Currencies is empty:
// ISO 4217 exponents 2, 2, 0 and 3, so that the minor-unit conversion of
// every kind is exercised.
var DefaultCurrencies = []string{"EUR", "USD", "JPY", "KWD"}

// Options describe the traffic to generate.
type Options struct {
	// Count is the number of messages, duplicates and invalid ones
	// included.
	Count int
	// Duplicates is the share of Count that re-sends an earlier valid
	// event byte for byte; Invalid the share that the decoder rejects.
	// Each is rounded to a whole number of messages; the rest are valid,
	// distinct events.
	Duplicates float64
	Invalid    float64
	// Currencies to draw amounts in; DefaultCurrencies when empty.
	Currencies []string
	// FirstOrder is the order id of the first fresh message; 1 when 0.
	FirstOrder int64
	// Seed makes the sequence replayable.
	Seed int64
	// Now is the clock of occurredAt; time.Now when nil.
	Now func() time.Time
	// Past, when its upper bound is set, dates every valid event at a
	// random moment between Past[0] and Past[1] before Now: its eventId's
	// time and its occurredAt, as for a backlog of days worked off after an
	// outage, or events replayed from the dead-letter topic.
	Past [2]time.Duration
}

// Kind is what a message is for the consumer.
type Kind int

// The kinds of messages.
const (
	// Valid is the first copy of a valid event.
	Valid Kind = iota
	// Duplicate re-sends the exact bytes and key of an earlier Valid one.
	Duplicate
	// Invalid is rejected by order.Parse; the consumer parks it in the
	// dead-letter topic.
	Invalid
)

func (k Kind) String() string {
	switch k {
	case Valid:
		return "valid"
	case Duplicate:
		return "duplicate"
	case Invalid:
		return "invalid"
	}
	return fmt.Sprintf("Kind(%d)", int(k))
}

// Message is one Kafka record to publish.
type Message struct {
	Key []byte
	// Value is nil for a tombstone.
	Value   []byte
	Kind    Kind
	OrderID int64
	// EventID is the event's id for Valid and Duplicate messages.
	EventID string
	// Defect names the rule an Invalid message breaks (one of Defects).
	Defect string
}

// Event is the expectation for one valid event: what the provider must be
// asked to charge, exactly once.
type Event struct {
	ID         uuid.UUID
	OrderID    int64
	CustomerID int64
	Amount     order.Money
}

// Expected is the truth about the messages a Generator has returned.
type Expected struct {
	// Produced counts all messages; Produced = Unique + Duplicates + Invalid.
	Produced   int
	Unique     int
	Duplicates int
	Invalid    int
	// Events are the valid events in the order they were generated.
	Events []Event
	// Defects counts the invalid messages by defect.
	Defects map[string]int
	// LastOrder is the highest order id used; 0 when none was.
	LastOrder int64
}

// Declined returns how many of the valid events a provider that declines
// every order id divisible by every (fakepsp's DeclineEvery) declines.
func (e Expected) Declined(every int64) int {
	if every <= 0 {
		return 0
	}
	n := 0
	for _, ev := range e.Events {
		if ev.OrderID%every == 0 {
			n++
		}
	}
	return n
}

// Defects are the kinds of invalid messages, each a value order.Parse
// rejects for a different rule. Invalid messages cycle through them, so any
// run with at least len(Defects) invalid messages has every kind.
var Defects = []string{
	"tombstone",          // no value at all
	"bad-json",           // a valid event cut in half
	"string-amount",      // "totalAmount":"19.99"
	"uuid-v4",            // eventId of the wrong UUID version
	"unknown-currency",   // ZZZ
	"lowercase-currency", // eur
	"too-many-decimals",  // 19.991 EUR: not a whole number of cents
	"missing-field",      // no customerId
	"negative-amount",    // -19.99
	"wrong-event-type",   // order.created.v1
	"bad-timestamp",      // occurredAt without T and offset
	"oversize",           // larger than order.MaxSize
}

// recentWindow bounds how far back a "later" duplicate may reach, and so the
// memory a Generator holds for duplicates.
const recentWindow = 4096

// Generator yields the messages of one run. It is not safe for concurrent
// use.
type Generator struct {
	opts       Options
	rng        *rand.Rand
	nextOrder  int64
	defectBase int

	// Messages of each kind still to generate.
	leftValid, leftDup, leftInvalid int

	recent []Message // ring of the latest valid messages
	last   int       // index in recent of the latest one, -1 before any
	exp    Expected
}

// Split returns how many unique valid, duplicate and invalid messages
// opts describe.
func (o Options) Split() (unique, duplicates, invalid int, err error) {
	if o.Count < 0 {
		return 0, 0, 0, errors.New("count must not be negative")
	}
	for name, r := range map[string]float64{"duplicates": o.Duplicates, "invalid": o.Invalid} {
		if math.IsNaN(r) || r < 0 || r > 1 {
			return 0, 0, 0, fmt.Errorf("%s ratio %v is outside [0, 1]", name, r)
		}
	}
	duplicates = int(math.Round(float64(o.Count) * o.Duplicates))
	invalid = int(math.Round(float64(o.Count) * o.Invalid))
	unique = o.Count - duplicates - invalid
	switch {
	case unique < 0:
		return 0, 0, 0, fmt.Errorf("duplicates (%v) and invalid (%v) ratios add up to more than 1", o.Duplicates, o.Invalid)
	case duplicates > 0 && unique == 0:
		return 0, 0, 0, errors.New("duplicates need at least one valid event to repeat")
	}
	return unique, duplicates, invalid, nil
}

// New returns a generator of the traffic opts describe.
func New(opts Options) (*Generator, error) {
	unique, dups, invalid, err := opts.Split()
	if err != nil {
		return nil, err
	}
	if len(opts.Currencies) == 0 {
		opts.Currencies = DefaultCurrencies
	}
	for _, c := range opts.Currencies {
		if _, err := order.ParseMoney("1", c); err != nil {
			return nil, fmt.Errorf("currency %q: %w", c, err)
		}
	}
	if opts.FirstOrder == 0 {
		opts.FirstOrder = 1
	}
	if opts.FirstOrder < 1 || opts.FirstOrder > math.MaxInt64-int64(opts.Count) {
		return nil, fmt.Errorf("first order id %d is outside 1..%d", opts.FirstOrder, math.MaxInt64-int64(opts.Count))
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.Past[0] < 0 || opts.Past[1] < opts.Past[0] {
		return nil, fmt.Errorf("past %s..%s is not a range of durations ago", opts.Past[0], opts.Past[1])
	}
	rng := rand.New(rand.NewPCG(uint64(opts.Seed), 0x6c6f616467656e)) // "loadgen"
	return &Generator{
		opts:        opts,
		rng:         rng,
		nextOrder:   opts.FirstOrder,
		defectBase:  rng.IntN(len(Defects)),
		leftValid:   unique,
		leftDup:     dups,
		leftInvalid: invalid,
		last:        -1,
		exp:         Expected{Defects: map[string]int{}},
	}, nil
}

// Remaining is the number of messages Next has yet to return.
func (g *Generator) Remaining() int { return g.leftValid + g.leftDup + g.leftInvalid }

// Expected returns the truth about the messages returned so far.
func (g *Generator) Expected() Expected {
	e := g.exp
	e.Events = slices.Clone(g.exp.Events)
	e.Defects = make(map[string]int, len(g.exp.Defects))
	for k, v := range g.exp.Defects {
		e.Defects[k] = v
	}
	return e
}

// Next returns the next message, or false when all have been returned. An
// error means an event id could not be generated, which does not happen on
// a working system.
func (g *Generator) Next() (Message, bool, error) {
	dupWeight := g.leftDup
	if g.last < 0 {
		dupWeight = 0 // nothing to repeat yet
	}
	total := g.leftValid + dupWeight + g.leftInvalid
	if total == 0 {
		return Message{}, false, nil
	}
	var m Message
	var err error
	switch r := g.rng.IntN(total); {
	case r < g.leftValid:
		m, err = g.valid()
	case r < g.leftValid+dupWeight:
		m = g.duplicate()
	default:
		m, err = g.invalid()
	}
	if err != nil {
		return Message{}, false, err
	}
	g.exp.Produced++
	return m, true, nil
}

func (g *Generator) takeOrder() int64 {
	id := g.nextOrder
	g.nextOrder++
	g.exp.LastOrder = id
	return id
}

// event draws a valid event for a fresh order id.
func (g *Generator) event() (order.Event, error) {
	orderID := g.takeOrder()
	customerID := 1 + g.rng.Int64N(50_000)
	currency := g.opts.Currencies[g.rng.IntN(len(g.opts.Currencies))]
	// 100..99_999 minor units: 1.00..999.99 EUR, 100..99999 JPY,
	// 0.100..99.999 KWD.
	minor := 100 + g.rng.Int64N(99_900)
	at := g.opts.Now()
	past := g.opts.Past
	if past[1] == 0 {
		return order.New(orderID, customerID, order.Money{Minor: minor, Currency: currency}, at)
	}
	at = at.Add(-past[0] - time.Duration(g.rng.Int64N(int64(past[1]-past[0])+1)))
	ev, err := order.New(orderID, customerID, order.Money{Minor: minor, Currency: currency}, at)
	if err != nil {
		return ev, err
	}
	ev.ID, err = order.NewIDAt(at)
	return ev, err
}

func (g *Generator) valid() (Message, error) {
	ev, err := g.event()
	if err != nil {
		return Message{}, err
	}
	value, err := ev.MarshalJSON()
	if err != nil {
		return Message{}, err
	}
	m := Message{Key: orderKey(ev.OrderID), Value: value, Kind: Valid, OrderID: ev.OrderID, EventID: ev.ID.String()}
	if len(g.recent) < recentWindow {
		g.recent = append(g.recent, m)
		g.last = len(g.recent) - 1
	} else {
		g.last = (g.last + 1) % recentWindow
		g.recent[g.last] = m
	}
	g.leftValid--
	g.exp.Unique++
	g.exp.Events = append(g.exp.Events, Event{ID: ev.ID, OrderID: ev.OrderID, CustomerID: ev.CustomerID, Amount: ev.Amount})
	return m, nil
}

// duplicate repeats an earlier valid message: half the time the latest one,
// which usually went out just before and so shares its producer batch (and
// the consumer's fetch), else any of the recent window, far apart.
func (g *Generator) duplicate() Message {
	i := g.last
	if g.rng.IntN(2) == 1 {
		i = g.rng.IntN(len(g.recent))
	}
	orig := g.recent[i]
	g.leftDup--
	g.exp.Duplicates++
	return Message{Key: orig.Key, Value: orig.Value, Kind: Duplicate, OrderID: orig.OrderID, EventID: orig.EventID}
}

func (g *Generator) invalid() (Message, error) {
	defect := Defects[(g.defectBase+g.exp.Invalid)%len(Defects)]
	ev, err := g.event()
	if err != nil {
		return Message{}, err
	}
	value, err := corrupt(ev, defect)
	if err != nil {
		return Message{}, err
	}
	g.leftInvalid--
	g.exp.Invalid++
	g.exp.Defects[defect]++
	return Message{Key: orderKey(ev.OrderID), Value: value, Kind: Invalid, OrderID: ev.OrderID, Defect: defect}, nil
}

func orderKey(id int64) []byte { return strconv.AppendInt(nil, id, 10) }

// field is one top-level JSON member, its value as raw JSON text.
type field struct{ name, raw string }

// fields returns the members of ev's wire form, to be corrupted one at a
// time; rendered unchanged they are a valid event.
func fields(ev order.Event) []field {
	return []field{
		{"eventId", strconv.Quote(ev.ID.String())},
		{"eventType", strconv.Quote(order.EventType)},
		{"occurredAt", strconv.Quote(ev.OccurredAt.Format(time.RFC3339Nano))},
		{"aggregateType", `"Order"`},
		{"orderId", strconv.FormatInt(ev.OrderID, 10)},
		{"customerId", strconv.FormatInt(ev.CustomerID, 10)},
		{"totalAmount", ev.Amount.Decimal()},
		{"currency", strconv.Quote(ev.Amount.Currency)},
	}
}

func render(fs []field) []byte {
	var b strings.Builder
	b.WriteByte('{')
	for i, f := range fs {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(strconv.Quote(f.name))
		b.WriteByte(':')
		b.WriteString(f.raw)
	}
	b.WriteByte('}')
	return []byte(b.String())
}

// set returns fs with the value of name replaced by raw.
func set(fs []field, name, raw string) []field {
	out := slices.Clone(fs)
	for i := range out {
		if out[i].name == name {
			out[i].raw = raw
		}
	}
	return out
}

func get(fs []field, name string) string {
	for _, f := range fs {
		if f.name == name {
			return f.raw
		}
	}
	return ""
}

// corrupt returns the wire form of ev broken by defect.
func corrupt(ev order.Event, defect string) ([]byte, error) {
	fs := fields(ev)
	amount := get(fs, "totalAmount")
	switch defect {
	case "tombstone":
		return nil, nil
	case "bad-json":
		v := render(fs)
		return v[:len(v)/2], nil
	case "string-amount":
		return render(set(fs, "totalAmount", strconv.Quote(amount))), nil
	case "uuid-v4":
		id, err := uuid.NewV4()
		if err != nil {
			return nil, fmt.Errorf("loadgen: generate UUID v4: %w", err)
		}
		return render(set(fs, "eventId", strconv.Quote(id.String()))), nil
	case "unknown-currency":
		return render(set(fs, "currency", `"ZZZ"`)), nil
	case "lowercase-currency":
		return render(set(fs, "currency", strings.ToLower(get(fs, "currency")))), nil
	case "too-many-decimals":
		// One digit more than the currency has: 19.991 EUR, 1999.5 JPY.
		if strings.Contains(amount, ".") {
			return render(set(fs, "totalAmount", amount+"1")), nil
		}
		return render(set(fs, "totalAmount", amount+".5")), nil
	case "missing-field":
		return render(slices.DeleteFunc(fs, func(f field) bool { return f.name == "customerId" })), nil
	case "negative-amount":
		return render(set(fs, "totalAmount", "-"+amount)), nil
	case "wrong-event-type":
		return render(set(fs, "eventType", `"order.created.v1"`)), nil
	case "bad-timestamp":
		return render(set(fs, "occurredAt", strconv.Quote(ev.OccurredAt.Format(time.DateTime)))), nil
	case "oversize":
		// A valid event but for its size: an unknown field pads it past
		// the limit.
		base := len(render(fs)) + len(`,"padding":""`)
		pad := strings.Repeat("x", max(order.MaxSize+1-base, 0))
		return render(append(fs, field{"padding", strconv.Quote(pad)})), nil
	}
	return nil, fmt.Errorf("loadgen: unknown defect %q", defect)
}

package consumer

// This file is a key's goroutine: one key's messages, one at a time in
// offset order, each taken through billing (Handle), retried with backoff
// in the goroutine while billing leaves it pending, written to the
// dead-letter topic when it is parked, and finished before the next. A
// key whose message must be retried waits alone; the partition's other
// keys go on.

import (
	"errors"
	"time"

	"github.com/cenkalti/backoff/v5"
	"go.opentelemetry.io/otel/codes"

	"example.com/billing/internal/billing"
)

// key is one key's unfinished messages, in offset order.
type key struct {
	name string
	msgs []*message // msgs[0] is the one its goroutine handles (guarded by partition.mu)
	// retrying: msgs[0] failed and waits for its retry (counted, with the
	// messages behind it, in billing_messages_retrying; guarded by
	// partition.mu).
	retrying bool
}

// handleKey is k's goroutine: it handles k's messages one at a time, in
// offset order, each until it is finished, and ends when k has none left
// or the claim has ended (then giving up the ones it has not finished).
func (p *partition) handleKey(k *key) {
	for {
		p.mu.Lock()
		if len(k.msgs) == 0 {
			delete(p.keys, k.name)
			p.mu.Unlock()
			return
		}
		m := k.msgs[0]
		p.mu.Unlock()
		if !p.handle(k, m) {
			p.giveUp(k)
			return
		}
		p.mu.Lock()
		k.msgs[0] = nil // the backing array must not keep it alive
		k.msgs = k.msgs[1:]
		if k.retrying {
			k.retrying = false
			p.c.metrics.Retrying.Sub(float64(len(k.msgs) + 1))
		}
		p.mu.Unlock()
		p.finish(m)
	}
}

// handle takes m to its outcome: billing's verdict (Handle; a message that
// is no event is parked without it), then, for a parked one, the
// dead-letter writer's acknowledgement. While billing leaves it pending or
// the dead-letter topic does not take it, it is tried again after a
// backoff (retry), its key's later messages waiting behind it; billing's
// verdict is asked once, the parking retried alone. It reports false once
// the claim has ended before m finished: m is given up, unmarked.
func (p *partition) handle(k *key, m *message) bool {
	var wait *backoff.ExponentialBackOff
	for p.admitted() {
		done, err := p.try(m)
		if done {
			return true
		}
		if wait == nil { // most messages never need one
			wait = backoff.NewExponentialBackOff()
			wait.InitialInterval, wait.MaxInterval = 100*time.Millisecond, 5*time.Second
		}
		if p.draining.Load() || !p.retry(k, m, wait.NextBackOff(), err) {
			return false // given up with the rest of the claim
		}
	}
	return false
}

// try takes m once through billing, unless billing decided it already,
// and to the dead-letter topic when it is parked; done reports that m is
// finished, err why not.
func (p *partition) try(m *message) (done bool, err error) {
	if !m.decided {
		if err = p.ask(m); !m.decided {
			return false, err
		}
	}
	if m.res.Outcome != billing.Parked {
		return true, nil
	}
	return p.deadLetter(m)
}

// ask has billing handle m's event.
func (p *partition) ask(m *message) error {
	var err error
	m.res, err = p.c.proc.Handle(p.work, m.bill)
	m.decided = m.res.Outcome != billing.Pending
	return err
}

// deadLetter writes m, parked, to the dead-letter topic and reports
// whether the broker took it.
func (p *partition) deadLetter(m *message) (bool, error) {
	parked, err := p.c.dlq.Park(m.msg, m.res.Reason)
	if err != nil {
		return false, err
	}
	m.res.Reason = parked // an oversize one when only a reference fit
	return true, nil
}

// retry waits d (the backoff's next interval, with jitter) before m is
// tried again, at least the Retry-After err carries, and reports false
// when the claim ends first.
func (p *partition) retry(k *key, m *message, d time.Duration, err error) bool {
	if ra, ok := errors.AsType[retryAfter](err); ok {
		d = max(d, ra.RetryAfter())
	}
	p.retrying(k, m, d, err)
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-p.ended:
		return false
	}
}

// admitted waits while the coordinator does not confirm the membership
// (the partition may be another member's by now), and reports false once
// the claim has ended: no new message or retry starts then.
func (p *partition) admitted() bool {
	for !p.draining.Load() {
		if p.c.member.holds() {
			return true
		}
		changed := p.c.member.changes()
		if p.c.member.holds() { // confirmed before changed was read
			return true
		}
		select {
		case <-changed:
		case <-p.ended:
		}
	}
	return false
}

// retryAfter is what an error that leaves a message to retry may say: the
// least wait (a payment provider's Retry-After).
type retryAfter interface {
	error
	RetryAfter() time.Duration
}

// retrying sets k aside until its message m is tried again after wait:
// it and the messages behind it are counted as retrying, and the retries
// are logged once a second.
func (p *partition) retrying(k *key, m *message, wait time.Duration, err error) {
	p.mu.Lock()
	if !k.retrying {
		k.retrying = true
		p.c.metrics.Retrying.Add(float64(len(k.msgs)))
	}
	p.retried++
	now := time.Now()
	if now.Sub(p.lastWarn) < time.Second {
		p.mu.Unlock()
		return
	}
	retried, keys := p.retried, p.retryingKeys()
	p.retried, p.lastWarn = 0, now
	p.mu.Unlock()
	p.c.log.Warn("retrying messages", "topic", p.topic, "partition", p.id,
		"offset", m.msg.Offset, "trace_id", traceID(m.span), "messages", retried,
		"keys_waiting", keys, "retry_in", wait, "err", err)
}

// retryingKeys counts the keys waiting for a retry; p.mu is held.
func (p *partition) retryingKeys() int {
	n := 0
	for _, k := range p.keys {
		if k.retrying {
			n++
		}
	}
	return n
}

// giveUp gives up k's unfinished messages when the claim ends: they are
// not marked, so the partition's next owner gets them again.
func (p *partition) giveUp(k *key) {
	p.mu.Lock()
	ms := k.msgs
	k.msgs = nil
	delete(p.keys, k.name)
	if k.retrying {
		k.retrying = false
		p.c.metrics.Retrying.Sub(float64(len(ms)))
	}
	p.mu.Unlock()
	for _, m := range ms {
		m.span.SetStatus(codes.Error, "abandoned: the partition was released; its next owner processes it")
		m.span.End()
		p.c.bytes.Add(-m.size)
		<-p.c.tokens
	}
}

package billing

import (
	"context"
	"errors"
	"sync"
)

// Process is the tests' way to run events: Handle for each of msgs at once,
// on a goroutine each, their claims queued together so that one writer
// claims them in one transaction, in the order given (events of one order
// are decided in that order); it returns their results, in order, with the
// reasons of those left Pending joined.
func (p *Processor) Process(ctx context.Context, msgs []Message) ([]Result, error) {
	results := make([]Result, len(msgs))
	errs := make([]error, len(msgs))
	var tries []*try
	var claim []*claimant
	var at []int
	for i, m := range msgs {
		t := p.newTry(ctx, &m)
		if t.res.Outcome == Parked && !t.res.announced() {
			results[i], errs[i] = t.res, t.tally(nil)
			continue
		}
		tries, claim, at = append(tries, t), append(claim, t.claimant()), append(at, i)
	}
	queued := p.toClaim(claim...)
	var wg sync.WaitGroup
	for n, t := range tries {
		wg.Go(func() {
			errs[at[n]] = t.tally(p.phases(t, claim[n], queued))
			results[at[n]] = t.res
		})
	}
	wg.Wait()
	return results, errors.Join(uniqueErrors(errs)...)
}

// uniqueErrors drops nils and repeats of one error: a batch left pending by
// one outage reports it once.
func uniqueErrors(errs []error) []error {
	var out []error
	seen := map[error]bool{}
	for _, err := range errs {
		if err != nil && !seen[err] {
			seen[err] = true
			out = append(out, err)
		}
	}
	return out
}

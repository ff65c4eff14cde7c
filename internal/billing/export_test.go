package billing

import (
	"context"
	"errors"
	"sync"
)

// Process is the tests' way to run events: Submit for each of msgs at
// once, then wait for their results, in order, with the reasons of those
// left Pending joined. Events of one order are claimed in the order given.
func (p *Processor) Process(ctx context.Context, msgs []Message) ([]Result, error) {
	results := make([]Result, len(msgs))
	errs := make([]error, len(msgs))
	var wg sync.WaitGroup
	wg.Add(len(msgs))
	var claim []*job
	for i, m := range msgs {
		j := p.newJob(ctx, m, func(r Result, err error) { results[i], errs[i] = r, err; wg.Done() })
		if j.res.Outcome == Parked && !j.res.announced() {
			j.finish(nil)
			continue
		}
		claim = append(claim, j)
	}
	if !p.claims.push(claim...) { // one push: one writer takes them in order
		for _, j := range claim {
			j.finish(ErrStopped)
		}
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

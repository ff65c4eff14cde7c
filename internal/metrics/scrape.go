package metrics

import (
	"context"
	"fmt"
	"io"
	"math"
	"net/http"
	"sort"
	"strings"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// Snapshot is a /metrics page as read back: by the demo's summary, the
// benchmark and the tests.
type Snapshot struct {
	// Values of counters and gauges by series, e.g.
	// billing_events_total{outcome="charged"} (labels sorted by name).
	Values map[string]float64
	// Histograms by series, e.g. billing_db_transaction_seconds{phase="claim"}.
	Histograms map[string]Histogram
}

// Histogram is a Prometheus histogram: cumulative counts by upper bound.
type Histogram struct {
	Count   float64
	Sum     float64
	Buckets []Bucket // by upper bound, ascending; +Inf omitted
}

// Bucket is one cumulative bucket of a histogram.
type Bucket struct{ Upper, Cumulative float64 }

// maxPage bounds a /metrics page read back.
const maxPage = 16 << 20

// Scrape reads the /metrics page at url (http://host:port/metrics).
func Scrape(ctx context.Context, url string) (Snapshot, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return Snapshot{}, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return Snapshot{}, fmt.Errorf("GET %s: %w", url, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxPage))
	if err != nil {
		return Snapshot{}, fmt.Errorf("GET %s: %w", url, err)
	}
	if resp.StatusCode != http.StatusOK {
		return Snapshot{}, fmt.Errorf("GET %s: status %d", url, resp.StatusCode)
	}
	return Parse(string(body))
}

// Parse reads a /metrics page in the Prometheus text format.
func Parse(page string) (Snapshot, error) {
	snap := Snapshot{Values: map[string]float64{}, Histograms: map[string]Histogram{}}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(strings.NewReader(page))
	if err != nil {
		return snap, fmt.Errorf("parse /metrics: %w", err)
	}
	for name, fam := range fams {
		for _, m := range fam.GetMetric() {
			var labels []string
			for _, l := range m.GetLabel() {
				labels = append(labels, fmt.Sprintf("%s=%q", l.GetName(), l.GetValue()))
			}
			sort.Strings(labels)
			series := name
			if len(labels) > 0 {
				series += "{" + strings.Join(labels, ",") + "}"
			}
			switch {
			case m.Counter != nil:
				snap.Values[series] = m.GetCounter().GetValue()
			case m.Gauge != nil:
				snap.Values[series] = m.GetGauge().GetValue()
			case m.Histogram != nil:
				h := Histogram{Count: float64(m.GetHistogram().GetSampleCount()), Sum: m.GetHistogram().GetSampleSum()}
				for _, b := range m.GetHistogram().GetBucket() {
					if !math.IsInf(b.GetUpperBound(), 1) {
						h.Buckets = append(h.Buckets, Bucket{b.GetUpperBound(), float64(b.GetCumulativeCount())})
					}
				}
				sort.Slice(h.Buckets, func(i, j int) bool { return h.Buckets[i].Upper < h.Buckets[j].Upper })
				snap.Histograms[series] = h
			}
		}
	}
	return snap, nil
}

// Above returns how many observations exceeded bound (which must be one of
// the histogram's bucket bounds).
func (h Histogram) Above(bound float64) float64 {
	for _, b := range h.Buckets {
		if b.Upper == bound {
			return h.Count - b.Cumulative
		}
	}
	return math.NaN()
}

// BucketOf returns the bounds (lower, upper] of the bucket that holds the
// q-quantile: all a histogram knows about it. upper is +Inf when it is
// above the highest finite bound; both are NaN when the histogram is empty.
func (h Histogram) BucketOf(q float64) (lower, upper float64) {
	if h.Count == 0 {
		return math.NaN(), math.NaN()
	}
	rank := q * h.Count
	for _, b := range h.Buckets {
		if b.Cumulative >= rank {
			return lower, b.Upper
		}
		lower = b.Upper
	}
	return lower, math.Inf(1)
}

// Quantile estimates the q-quantile by linear interpolation within its
// bucket, as PromQL's histogram_quantile does; NaN when empty, the highest
// finite bound when it lies above it.
func (h Histogram) Quantile(q float64) float64 {
	lower, upper := h.BucketOf(q)
	if math.IsNaN(upper) || math.IsInf(upper, 1) {
		return lower
	}
	rank := q * h.Count
	below := 0.0
	for _, b := range h.Buckets {
		if b.Upper == upper {
			in := b.Cumulative - below
			if in == 0 {
				return upper
			}
			return lower + (upper-lower)*(rank-below)/in
		}
		below = b.Cumulative
	}
	return upper
}

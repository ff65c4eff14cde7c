package fakepsp

import (
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Stripe's page sizes.
const (
	defaultPageSize = 10
	maxPageSize     = 100
)

// admitLookup counts a lookup with count and applies the rules every Stripe
// /v1 request meets first (down, rate limit, API key, version).
func (s *Server) admitLookup(count func(*StripeLookups), h http.Header) (stripeAnswer, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	count(&s.stats.Stripe.Lookups)
	ans, refused := s.refuseLocked(time.Now(), h)
	if refused {
		s.stats.Stripe.Lookups.Rejected++
	}
	return ans, refused
}

// rejectLookup answers a lookup whose parameters are wrong, and counts it.
func (s *Server) rejectLookup(w http.ResponseWriter, r *http.Request, requestID string, f *stripeFailure) {
	s.mu.Lock()
	if f.status == http.StatusNotFound && r.Pattern == "GET /v1/payment_intents/{id}" {
		s.stats.Stripe.Lookups.NotFound++
	} else {
		s.stats.Stripe.Lookups.Rejected++
	}
	s.mu.Unlock()
	s.writeStripe(w, r, requestID, stripeErrorAnswer(f.status, "", f.err))
}

func (s *Server) handleRetrieveIntent(w http.ResponseWriter, r *http.Request) {
	if !s.serves(ProfileStripe, w, r) {
		return
	}
	requestID := newID("req_")
	if ans, refused := s.admitLookup(func(l *StripeLookups) { l.Retrieve++ }, r.Header); refused {
		s.writeStripe(w, r, requestID, ans)
		return
	}
	if f := checkQuery(r.URL.Query()); f != nil {
		s.rejectLookup(w, r, requestID, f)
		return
	}
	id := r.PathValue("id")
	s.mu.Lock()
	in, ok := s.stripe.byID[id]
	var body []byte
	if ok {
		body = marshal(in.object())
	}
	s.mu.Unlock()
	if !ok {
		s.rejectLookup(w, r, requestID, missingResource("intent", fmt.Sprintf("No such payment_intent: '%s'", id)))
		return
	}
	s.writeStripe(w, r, requestID, stripeAnswer{status: http.StatusOK, body: body})
}

// intentList is Stripe's list object.
type intentList struct {
	Object  string          `json:"object"` // "list"
	Data    []paymentIntent `json:"data"`
	HasMore bool            `json:"has_more"`
	URL     string          `json:"url"`
}

// searchResult is Stripe's search result object.
type searchResult struct {
	Object   string          `json:"object"` // "search_result"
	Data     []paymentIntent `json:"data"`
	HasMore  bool            `json:"has_more"`
	NextPage *string         `json:"next_page"`
	URL      string          `json:"url"`
}

// listFilter selects PaymentIntents for a list: by customer and a created
// range in unix seconds, both bounds included.
type listFilter struct {
	customer string
	from, to int64
}

func (f listFilter) matches(in *intent) bool {
	created := in.created.Unix()
	return (f.customer == "" || in.customer == f.customer) && created >= f.from && created <= f.to
}

func (s *Server) handleListIntents(w http.ResponseWriter, r *http.Request) {
	if !s.serves(ProfileStripe, w, r) {
		return
	}
	requestID := newID("req_")
	if ans, refused := s.admitLookup(func(l *StripeLookups) { l.List++ }, r.Header); refused {
		s.writeStripe(w, r, requestID, ans)
		return
	}
	q := r.URL.Query()
	filter, limit, f := parseListQuery(q)
	if f != nil {
		s.rejectLookup(w, r, requestID, f)
		return
	}
	s.mu.Lock()
	page, hasMore, f := s.pageLocked(q.Get("starting_after"), "starting_after", limit, filter.matches)
	s.mu.Unlock()
	if f != nil {
		s.rejectLookup(w, r, requestID, f)
		return
	}
	s.writeStripe(w, r, requestID, stripeAnswer{status: http.StatusOK, body: marshal(intentList{
		Object: "list", Data: page, HasMore: hasMore, URL: "/v1/payment_intents"})})
}

// parseListQuery reads the parameters of GET /v1/payment_intents.
func parseListQuery(q url.Values) (listFilter, int, *stripeFailure) {
	if f := checkQuery(q, "customer", "created", "created[gt]", "created[gte]", "created[lt]", "created[lte]",
		"limit", "starting_after", "ending_before"); f != nil {
		return listFilter{}, 0, f
	}
	if q.Has("ending_before") {
		return listFilter{}, 0, invalidRequest("ending_before", "", "The fake does not page backwards: use starting_after.")
	}
	filter := listFilter{customer: q.Get("customer"), from: 0, to: 1<<63 - 1}
	for _, b := range []struct {
		name   string
		narrow func(v int64)
	}{
		{"created", func(v int64) { filter.from, filter.to = max(filter.from, v), min(filter.to, v) }},
		{"created[gt]", func(v int64) { filter.from = max(filter.from, v+1) }},
		{"created[gte]", func(v int64) { filter.from = max(filter.from, v) }},
		{"created[lt]", func(v int64) { filter.to = min(filter.to, v-1) }},
		{"created[lte]", func(v int64) { filter.to = min(filter.to, v) }},
	} {
		if !q.Has(b.name) {
			continue
		}
		v, err := strconv.ParseInt(q.Get(b.name), 10, 64)
		if err != nil {
			return listFilter{}, 0, invalidRequest(b.name, "parameter_invalid_integer", "Invalid integer: %s", q.Get(b.name))
		}
		b.narrow(v)
	}
	limit, f := parseLimit(q)
	return filter, limit, f
}

func (s *Server) handleSearchIntents(w http.ResponseWriter, r *http.Request) {
	if !s.serves(ProfileStripe, w, r) {
		return
	}
	requestID := newID("req_")
	if ans, refused := s.admitLookup(func(l *StripeLookups) { l.Search++ }, r.Header); refused {
		s.writeStripe(w, r, requestID, ans)
		return
	}
	q := r.URL.Query()
	if f := checkQuery(q, "query", "limit", "page"); f != nil {
		s.rejectLookup(w, r, requestID, f)
		return
	}
	clauses, f := parseSearchQuery(q.Get("query"))
	if !q.Has("query") {
		f = invalidRequest("query", "parameter_missing", "Missing required param: query.")
	}
	if f == nil {
		var limit int
		limit, f = parseLimit(q)
		if f == nil {
			s.search(w, r, requestID, clauses, limit)
			return
		}
	}
	s.rejectLookup(w, r, requestID, f)
}

// search answers a search: the PaymentIntents whose metadata has every
// clause, among those created at least SearchLag ago, newest first.
func (s *Server) search(w http.ResponseWriter, r *http.Request, requestID string, clauses map[string]string, limit int) {
	s.mu.Lock()
	indexed := time.Now().Add(-s.opts.searchLag())
	page, hasMore, f := s.pageLocked(r.URL.Query().Get("page"), "page", limit, func(in *intent) bool {
		if in.created.After(indexed) {
			return false
		}
		for k, v := range clauses {
			if in.metadata[k] != v {
				return false
			}
		}
		return true
	})
	s.mu.Unlock()
	if f != nil {
		s.rejectLookup(w, r, requestID, f)
		return
	}
	result := searchResult{Object: "search_result", Data: page, HasMore: hasMore, URL: "/v1/payment_intents/search"}
	if hasMore {
		// The cursor is the last id of the page; Stripe's is opaque too.
		next := page[len(page)-1].ID
		result.NextPage = &next
	}
	s.writeStripe(w, r, requestID, stripeAnswer{status: http.StatusOK, body: marshal(result)})
}

// pageLocked returns up to limit PaymentIntents that match, newest first,
// after the one whose id is cursor (param names it in a failure), and
// whether more match. s.mu must be held.
func (s *Server) pageLocked(cursor, param string, limit int, match func(*intent) bool) ([]paymentIntent, bool, *stripeFailure) {
	intents := s.stripe.intents
	end := len(intents)
	if cursor != "" {
		i := slices.IndexFunc(intents, func(in *intent) bool { return in.id == cursor })
		if i < 0 {
			return nil, false, missingResource(param, fmt.Sprintf("No such payment_intent: '%s'", cursor))
		}
		end = i
	}
	page := []paymentIntent{}
	for i := end - 1; i >= 0; i-- {
		if !match(intents[i]) {
			continue
		}
		if len(page) == limit {
			return page, true, nil
		}
		page = append(page, intents[i].object())
	}
	return page, false, nil
}

// parseLimit reads a page size, 1 to 100, default 10.
func parseLimit(q url.Values) (int, *stripeFailure) {
	if !q.Has("limit") {
		return defaultPageSize, nil
	}
	n, err := strconv.Atoi(q.Get("limit"))
	if err != nil || n < 1 || n > maxPageSize {
		return 0, invalidRequest("limit", "parameter_invalid_integer",
			"Invalid limit: %q must be an integer from 1 to %d.", q.Get("limit"), maxPageSize)
	}
	return n, nil
}

// checkQuery refuses a parameter not in allowed, or one given twice.
func checkQuery(q url.Values, allowed ...string) *stripeFailure {
	for name, values := range q {
		switch {
		case !slices.Contains(allowed, name):
			return invalidRequest(name, "parameter_unknown", "Received unknown parameter: %s", name)
		case len(values) > 1:
			return invalidRequest(name, "", "%s is given more than once.", name)
		}
	}
	return nil
}

// parseSearchQuery reads the one form of Stripe's search query language the
// fake understands: metadata['key']:'value' clauses, quoted with ' or ",
// joined by AND.
func parseSearchQuery(query string) (map[string]string, *stripeFailure) {
	bad := func() (map[string]string, *stripeFailure) {
		return nil, invalidRequest("query", "", "The fake only searches metadata['key']:'value' clauses joined by AND, not %q.", query)
	}
	clauses := map[string]string{}
	for clause := range strings.SplitSeq(query, " AND ") {
		rest, ok := strings.CutPrefix(strings.TrimSpace(clause), "metadata[")
		if !ok {
			return bad()
		}
		key, rest, ok := cutQuoted(rest)
		if !ok {
			return bad()
		}
		if rest, ok = strings.CutPrefix(rest, "]:"); !ok {
			return bad()
		}
		value, rest, ok := cutQuoted(rest)
		if !ok || rest != "" || key == "" {
			return bad()
		}
		clauses[key] = value
	}
	return clauses, nil
}

// cutQuoted cuts a string quoted with ' or " off the start of s.
func cutQuoted(s string) (quoted, rest string, ok bool) {
	if s == "" || (s[0] != '\'' && s[0] != '"') {
		return "", "", false
	}
	end := strings.IndexByte(s[1:], s[0])
	if end < 0 {
		return "", "", false
	}
	return s[1 : 1+end], s[2+end:], true
}

// Package contract speaks billing's own provider contract (DESIGN.md,
// "Payment provider call"): POST {base}/v1/charges with a JSON body, a
// status code per outcome, 202 for a payment decided later, a lookup by
// idempotency key, a Stripe-like list for reconciliation and a signed
// webhook. billing fakepsp serves it; a provider of one's own, or a
// gateway in front of a real one, can too.
package contract

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strings"

	"example.com/billing/internal/payment"
)

// Protocol is the contract's payment.Protocol.
type Protocol struct {
	charges string // {base}/v1/charges
	apiKey  string // sent as a bearer token; never logged
}

// New returns the contract at baseURL (e.g. https://psp.example.com;
// /v1/charges is appended), authorized with apiKey when it is set.
func New(baseURL, apiKey string) *Protocol {
	return &Protocol{charges: strings.TrimRight(baseURL, "/") + "/v1/charges", apiKey: apiKey}
}

type chargeBody struct {
	OrderID    int64  `json:"orderId"`
	CustomerID int64  `json:"customerId"`
	Amount     int64  `json:"amount"`
	Currency   string `json:"currency"`
}

// answer is the body of a 200, 201 or 202, and of a lookup's entry.
type answer struct {
	ID          string `json:"id"`
	Status      string `json:"status"`
	DeclineCode string `json:"declineCode,omitempty"`
}

// Charge sends POST {base}/v1/charges and classifies the answer:
//
//	200/201 {"id","status":"succeeded"}  Succeeded
//	200/201/202 {"id","status":"processing"}  InProgress
//	402  Declined (error.decline_code, else error.code)
//	400, 422  Rejected (malformed; the key reused with another body)
//	409, 429, 5xx, 401, 403, anything else  transient
func (p *Protocol) Charge(ctx context.Context, do payment.Doer, r payment.Request) (payment.Outcome, error) {
	// Integers and a validated three-letter code: marshalling cannot fail.
	body, _ := json.Marshal(chargeBody{OrderID: r.OrderID, CustomerID: r.CustomerID, Amount: r.Amount, Currency: r.Currency})
	resp, err := payment.PostCharge(ctx, do, p.charges, "application/json", r.IdempotencyKey, body, p.authorize)
	if err != nil {
		return payment.Outcome{}, err
	}
	return p.classify(resp)
}

func (p *Protocol) classify(resp payment.Response) (payment.Outcome, error) {
	replayed := resp.Header.Get("Idempotent-Replayed") == "true"
	snippet := payment.Snippet(resp.Body, p.apiKey)
	switch code := resp.Status; {
	case code == http.StatusOK || code == http.StatusCreated || code == http.StatusAccepted:
		var a answer
		if err := json.Unmarshal(resp.Body, &a); err == nil && a.ID != "" {
			switch {
			case a.Status == "succeeded" && code != http.StatusAccepted:
				return payment.Outcome{Kind: payment.Succeeded, Ref: a.ID, Replayed: replayed}, nil
			case a.Status == "processing":
				return payment.Outcome{Kind: payment.InProgress, Ref: a.ID, Replayed: replayed}, nil
			}
		}
		// A success we cannot read is not a charge we can record; asking
		// again with the same key gets the stored answer.
		return payment.Outcome{}, payment.Transient("bad_response", 0, fmt.Errorf("unexpected answer %d %s", code, snippet))
	case code == http.StatusPaymentRequired:
		return payment.Outcome{Kind: payment.Declined, Code: declineCode(resp.Body), Detail: "402 " + snippet, Replayed: replayed}, nil
	case code == http.StatusUnprocessableEntity || code == http.StatusBadRequest:
		return payment.Outcome{Kind: payment.Rejected, Detail: fmt.Sprintf("%d %s", code, snippet), Replayed: replayed}, nil
	case code == http.StatusConflict:
		// The same key is still being processed by the provider (our
		// previous attempt, whose answer we lost): ask again later.
		return payment.Outcome{}, payment.Transient("conflict", 0, fmt.Errorf("409 request in progress"))
	case code == http.StatusTooManyRequests:
		return payment.Outcome{}, payment.Transient("rate_limited", payment.RetryAfter(resp.Header), fmt.Errorf("429 rate limited"))
	case code >= 500:
		return payment.Outcome{}, payment.Transient("server_error", payment.RetryAfter(resp.Header), fmt.Errorf("%d %s", code, snippet))
	case code == http.StatusUnauthorized || code == http.StatusForbidden:
		// Bad credentials are the environment's fault, not the event's:
		// hold the partition until an operator fixes PAYMENT_API_KEY.
		return payment.Outcome{}, payment.Transient("unauthorized", 0, fmt.Errorf("%d check PAYMENT_API_KEY", code))
	default:
		return payment.Outcome{}, payment.Transient("client_error", 0, fmt.Errorf("unexpected status %d %s", code, snippet))
	}
}

// declineCode reads a Stripe-like 402 body: error.decline_code, else
// error.code.
func declineCode(body []byte) string {
	var answer struct {
		Error struct {
			DeclineCode string `json:"decline_code"`
			Code        string `json:"code"`
		} `json:"error"`
	}
	if json.Unmarshal(body, &answer) != nil {
		return ""
	}
	if answer.Error.DeclineCode != "" {
		return payment.Code(answer.Error.DeclineCode)
	}
	return payment.Code(answer.Error.Code)
}

// Resolve asks GET {base}/v1/charges?idempotency_key=<key>: the outcome the
// provider stored under the attempt's key, Unknown when it holds none.
func (p *Protocol) Resolve(ctx context.Context, do payment.Doer, l payment.Lookup) (payment.Outcome, error) {
	var found struct {
		Data []answer `json:"data"`
	}
	if err := p.get(ctx, do, url.Values{"idempotency_key": {l.IdempotencyKey}}, &found); err != nil {
		return payment.Outcome{}, err
	}
	if len(found.Data) == 0 {
		return payment.Outcome{Kind: payment.Unknown}, nil
	}
	a := found.Data[0]
	return payment.Outcome{Kind: kindOf(a.Status), Ref: a.ID, Code: payment.Code(a.DeclineCode)}, nil
}

// kindOf is what a status the contract reports (a lookup, a webhook) means.
func kindOf(status string) payment.Kind {
	switch status {
	case "succeeded":
		return payment.Succeeded
	case "declined":
		return payment.Declined
	case "processing":
		return payment.InProgress
	}
	return payment.Unknown
}

// authorize sets the bearer token, when there is one.
func (p *Protocol) authorize(req *http.Request) {
	if p.apiKey != "" {
		req.Header.Set("Authorization", "Bearer "+p.apiKey)
	}
}

package fakepsp_test

import (
	"fmt"
	"log"
	"net/http"
	"net/http/httptest"
	"strings"

	"example.com/billing/internal/dev/fakepsp"
)

func Example() {
	psp := fakepsp.New(fakepsp.Options{DeclineEvery: 2})
	srv := httptest.NewServer(psp)
	defer srv.Close()

	for _, orderID := range []int{1, 2, 1} {
		body := fmt.Sprintf(`{"orderId":%d,"customerId":45,"amount":1999,"currency":"EUR"}`, orderID)
		req, err := http.NewRequest(http.MethodPost, srv.URL+"/v1/charges", strings.NewReader(body))
		if err != nil {
			log.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Idempotency-Key", fmt.Sprint("event-", orderID))
		resp, err := srv.Client().Do(req)
		if err != nil {
			log.Fatal(err)
		}
		resp.Body.Close()
		fmt.Printf("order %d: %s (replayed: %q)\n", orderID, resp.Status, resp.Header.Get("Idempotent-Replayed"))
	}

	stats := psp.Stats()
	fmt.Printf("charges: %d, declines: %d, replays: %d\n", stats.ChargesCreated, stats.Declines, stats.Replays)
	// Output:
	// order 1: 200 OK (replayed: "")
	// order 2: 402 Payment Required (replayed: "")
	// order 1: 200 OK (replayed: "true")
	// charges: 1, declines: 1, replays: 1
}

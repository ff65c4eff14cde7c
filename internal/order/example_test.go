package order_test

import (
	"errors"
	"fmt"

	"example.com/billing/internal/order"
)

func ExampleParse() {
	e, err := order.Parse([]byte(`{
		"eventId": "017f22e2-79b0-7cc3-98c4-dc0c0c07398f",
		"eventType": "order.confirmed.v1",
		"occurredAt": "2024-03-01T13:00:00+01:00",
		"aggregateType": "Order",
		"orderId": 42,
		"customerId": 7,
		"totalAmount": 19.99,
		"currency": "EUR"
	}`))
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(e.OrderID, e.Amount, e.OccurredAt, e.IDTime())
	// Output: 42 19.99 EUR 2024-03-01 12:00:00 +0000 UTC 2022-02-22 19:22:22 +0000 UTC
}

func ExampleParse_invalid() {
	_, err := order.Parse([]byte(`{"totalAmount": "19.99"}`))
	var verr *order.ValidationError
	if errors.As(err, &verr) {
		fmt.Printf("field %q: %v\n", verr.Field, err)
	}
	// Output: field "totalAmount": totalAmount: want a JSON number, got string
}

func ExampleParseMoney() {
	for _, n := range []string{"19.99", "10.100", "1e2", "19.999"} {
		m, err := order.ParseMoney(n, "EUR")
		fmt.Println(m.Minor, err)
	}
	// Output:
	// 1999 <nil>
	// 1010 <nil>
	// 10000 <nil>
	// 0 totalAmount: 19.999 has more decimal places than EUR allows (2)
}

package wallet_test

import (
	"strings"
	"testing"

	"example.com/billing/internal/testenv/dbtest"
	"example.com/billing/internal/wallet"
)

func TestRead(t *testing.T) {
	const header = "customer_id,customer_ref,payment_method_ref\n"
	tests := []struct {
		name string
		in   string
		want []wallet.Method
		err  string // a part of the error, "" for none
	}{
		{"OK", header + "7,cus_7,pm_card_visa\n8,cus_8,pm_8\n", []wallet.Method{{7, "cus_7", "pm_card_visa"}, {8, "cus_8", "pm_8"}}, ""},
		{"OK_CRLFAndQuotes", "customer_id,customer_ref,payment_method_ref\r\n\"7\",\"cus_7\",pm_7\r\n", []wallet.Method{{7, "cus_7", "pm_7"}}, ""},
		{"OK_ByteOrderMark", "\ufeff" + header + "7,cus_7,pm_7\n", []wallet.Method{{7, "cus_7", "pm_7"}}, ""},
		{"OK_HeaderOnly", header, nil, ""},
		{"ErrEmpty", "", nil, "line 1: empty input"},
		{"ErrWrongHeader", "customer,card\n7,pm_7\n", nil, "line 1"},
		{"ErrNotAnInteger", header + "7,cus_7,pm_7\nseven,cus_8,pm_8\n", nil, `line 3: customer_id "seven"`},
		{"ErrNotPositive", header + "0,cus_7,pm_7\n", nil, "line 2: customer_id"},
		{"ErrEmptyRef", header + "7,,pm_7\n", nil, "line 2: customer_ref"},
		{"OK_AdyenShopperReferenceWithSpaces", header + "7,Shopper Zoë 7,stored_7\n", []wallet.Method{{7, "Shopper Zoë 7", "stored_7"}}, ""},
		{"ErrControlCharacterInRef", header + "7,\"cus\t7\",pm_7\n", nil, "line 2: customer_ref"},
		{"ErrInvalidUTF8InRef", header + "7,cus\xff7,pm_7\n", nil, "line 2: customer_ref"},
		{"ErrTooManyFields", header + "7,cus_7,pm_7,extra\n", nil, "line 2"},
		{"ErrCustomerTwice", header + "7,cus_7,pm_7\n8,cus_8,pm_8\n7,cus_7,pm_9\n", nil, "line 4: customer 7 again (first on line 2)"},
		{"ErrUnclosedQuote", header + "7,\"cus_7,pm_7\n", nil, "line"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := wallet.Read(strings.NewReader(tt.in))
			if tt.err != "" {
				if err == nil || !strings.Contains(err.Error(), tt.err) {
					t.Fatalf("err = %v, want one containing %q", err, tt.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != len(tt.want) {
				t.Fatalf("got %+v, want %+v", got, tt.want)
			}
			for i := range got {
				if got[i] != tt.want[i] {
					t.Errorf("row %d = %+v, want %+v", i, got[i], tt.want[i])
				}
			}
		})
	}
}

// Save upserts per provider: a second import replaces a customer's method
// at that provider and leaves other providers' alone.
func TestSaveAndLookup(t *testing.T) {
	db, _ := dbtest.New(t)
	ctx := dbtest.Context(t)
	if err := wallet.Save(ctx, db, "stripe", []wallet.Method{{7, "cus_7", "pm_old"}, {8, "cus_8", "pm_8"}}); err != nil {
		t.Fatal(err)
	}
	if err := wallet.Save(ctx, db, "adyen", []wallet.Method{{7, "shopper-7", "stored-7"}}); err != nil {
		t.Fatal(err)
	}
	if err := wallet.Save(ctx, db, "stripe", []wallet.Method{{7, "cus_7", "pm_new"}}); err != nil {
		t.Fatal(err)
	}
	got, err := wallet.Lookup(ctx, db, "stripe", []int64{7, 8, 9})
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[7].PaymentMethodRef != "pm_new" || got[8].CustomerRef != "cus_8" {
		t.Errorf("stripe's methods %+v, want 7's replaced and 8's kept, none for 9", got)
	}
	if got, err := wallet.Lookup(ctx, db, "adyen", []int64{7}); err != nil || got[7].CustomerRef != "shopper-7" {
		t.Errorf("adyen's methods %+v, %v; want 7's untouched", got, err)
	}
}

package order_test

import (
	"errors"
	"math"
	"strings"
	"testing"

	"example.com/billing/internal/order"
)

func TestParseMoney(t *testing.T) {
	tests := []struct {
		name      string
		number    string
		currency  string
		want      int64  // minor units, when valid
		wantField string // Field of the *ValidationError, when invalid
		wantMsg   string // whole error text, when it matters
	}{
		{name: "OK_EUR", number: "19.99", currency: "EUR", want: 1999},
		{name: "OK_JPY", number: "1000", currency: "JPY", want: 1000},
		{name: "OK_KWD", number: "1.234", currency: "KWD", want: 1234},
		{name: "OK_KWDSmallest", number: "0.005", currency: "KWD", want: 5},
		{name: "OK_IntegerEUR", number: "7", currency: "EUR", want: 700},
		{name: "OK_TrailingZeros", number: "10.100", currency: "EUR", want: 1010},
		{name: "OK_JPYZeroFraction", number: "100.000", currency: "JPY", want: 100},
		{name: "OK_Exponent", number: "1e2", currency: "EUR", want: 10000},
		{name: "OK_ExponentPlus", number: "1.5E+1", currency: "EUR", want: 1500},
		{name: "OK_NegativeExponent", number: "1E-1", currency: "EUR", want: 10},
		{name: "OK_NegativeExponentWholeUnits", number: "1000e-3", currency: "JPY", want: 1},
		{name: "OK_ZeroExponent", number: "5e0", currency: "JPY", want: 5},
		{name: "OK_MaxInt64", number: "92233720368547758.07", currency: "EUR", want: math.MaxInt64},
		{name: "OK_MaxInt64Exponent", number: "9.223372036854775807e18", currency: "JPY", want: math.MaxInt64},
		{name: "OK_LongTrailingZeros", number: "1.000000000000000000000000000000000000000000000000000000000000", currency: "EUR", want: 100},
		{name: "OK_ExponentAtLimit", number: "0." + strings.Repeat("0", 57) + "1e64", currency: "JPY", want: 1_000_000},

		{name: "ErrTooManyDecimals", number: "10.001", currency: "EUR", wantField: "totalAmount",
			wantMsg: "totalAmount: 10.001 has more decimal places than EUR allows (2)"},
		{name: "ErrNotRounded", number: "19.999", currency: "EUR", wantField: "totalAmount"},
		{name: "ErrJPYFraction", number: "1.5", currency: "JPY", wantField: "totalAmount"},
		{name: "ErrBelowOneMinorUnit", number: "1e-3", currency: "EUR", wantField: "totalAmount"},
		{name: "ErrOverflow", number: "92233720368547758.08", currency: "EUR", wantField: "totalAmount"},
		{name: "ErrOverflowExponent", number: "1e17", currency: "EUR", wantField: "totalAmount"},
		{name: "ErrOverflowManyDigits", number: "100000000000000000000", currency: "JPY", wantField: "totalAmount"},
		{name: "ErrZero", number: "0", currency: "EUR", wantField: "totalAmount",
			wantMsg: "totalAmount: 0 is not positive"},
		{name: "ErrZeroFraction", number: "0.00", currency: "EUR", wantField: "totalAmount"},
		{name: "ErrZeroExponent", number: "0e5", currency: "EUR", wantField: "totalAmount"},
		{name: "ErrNegativeZero", number: "-0", currency: "EUR", wantField: "totalAmount"},
		{name: "ErrNegative", number: "-1", currency: "EUR", wantField: "totalAmount"},
		{name: "ErrHugeExponent", number: "1e999999999", currency: "EUR", wantField: "totalAmount"},
		{name: "ErrHugeNegativeExponent", number: "1e-999999999", currency: "EUR", wantField: "totalAmount"},
		{name: "ErrExponentBeyondLimit", number: "0." + strings.Repeat("0", 57) + "1e65", currency: "JPY", wantField: "totalAmount"},
		{name: "ErrTooLong", number: "1." + strings.Repeat("0", 63), currency: "EUR", wantField: "totalAmount"},
		{name: "ErrQuotedNumber", number: `"19.99"`, currency: "EUR", wantField: "totalAmount"},
		{name: "ErrEmptyNumber", number: "", currency: "EUR", wantField: "totalAmount"},
		{name: "ErrLetters", number: "abc", currency: "EUR", wantField: "totalAmount"},
		{name: "ErrPlusSign", number: "+1", currency: "EUR", wantField: "totalAmount"},
		{name: "ErrLeadingDot", number: ".5", currency: "EUR", wantField: "totalAmount"},
		{name: "ErrTrailingDot", number: "1.", currency: "EUR", wantField: "totalAmount"},
		{name: "ErrLeadingZero", number: "01", currency: "EUR", wantField: "totalAmount"},
		{name: "ErrEmptyExponent", number: "1e", currency: "EUR", wantField: "totalAmount"},
		{name: "ErrHex", number: "0x10", currency: "EUR", wantField: "totalAmount"},
		{name: "ErrNaN", number: "NaN", currency: "EUR", wantField: "totalAmount"},
		{name: "ErrInfinity", number: "Infinity", currency: "EUR", wantField: "totalAmount"},
		{name: "ErrSpace", number: " 1", currency: "EUR", wantField: "totalAmount"},
		{name: "ErrDigitSeparator", number: "1_000", currency: "EUR", wantField: "totalAmount"},

		{name: "ErrCurrencyUnknown", number: "1", currency: "ZZZ", wantField: "currency",
			wantMsg: "currency: ZZZ is not a known ISO 4217 currency"},
		{name: "ErrCurrencyLowerCase", number: "1", currency: "eur", wantField: "currency"},
		{name: "ErrCurrencyTooLong", number: "1", currency: "EURO", wantField: "currency"},
		{name: "ErrCurrencyEmpty", number: "1", currency: "", wantField: "currency"},
		{name: "ErrCurrencyNumeric", number: "1", currency: "978", wantField: "currency"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := order.ParseMoney(tt.number, tt.currency)
			if tt.wantField == "" {
				want := order.Money{Minor: tt.want, Currency: tt.currency}
				if err != nil || got != want {
					t.Fatalf("ParseMoney(%q, %q) = %+v, %v; want %+v", tt.number, tt.currency, got, err, want)
				}
				return
			}
			requireValidationError(t, err, tt.wantField)
			if tt.wantMsg != "" && err.Error() != tt.wantMsg {
				t.Errorf("error = %q, want %q", err, tt.wantMsg)
			}
			if got != (order.Money{}) {
				t.Errorf("ParseMoney returned %+v along with an error", got)
			}
		})
	}
}

// TestParseMoneyBoundedWork checks that an absurd exponent is rejected
// without big-number arithmetic: the only allocations allowed are the
// error's.
func TestParseMoneyBoundedWork(t *testing.T) {
	tests := []struct {
		name      string
		number    string
		maxAllocs float64
	}{
		{name: "OK_NoAllocations", number: "19.99", maxAllocs: 0},
		{name: "ErrHugeExponent", number: "1e999999999", maxAllocs: 4},
		{name: "ErrHugeNegativeExponent", number: "1e-999999999", maxAllocs: 4},
		{name: "ErrLongExponent", number: "1e" + strings.Repeat("9", 60), maxAllocs: 4},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			allocs := testing.AllocsPerRun(100, func() {
				_, _ = order.ParseMoney(tt.number, "EUR")
			})
			if allocs > tt.maxAllocs {
				t.Errorf("ParseMoney(%q) made %v allocations, want at most %v", tt.number, allocs, tt.maxAllocs)
			}
		})
	}
}

func TestMoneyDecimal(t *testing.T) {
	tests := []struct {
		name  string
		money order.Money
		want  string
	}{
		{name: "OK_EUR", money: order.Money{Minor: 1999, Currency: "EUR"}, want: "19.99"},
		{name: "OK_EURTrailingZero", money: order.Money{Minor: 1990, Currency: "EUR"}, want: "19.90"},
		{name: "OK_EURWhole", money: order.Money{Minor: 100, Currency: "EUR"}, want: "1.00"},
		{name: "OK_EUROneCent", money: order.Money{Minor: 1, Currency: "EUR"}, want: "0.01"},
		{name: "OK_JPY", money: order.Money{Minor: 1000, Currency: "JPY"}, want: "1000"},
		{name: "OK_KWD", money: order.Money{Minor: 5, Currency: "KWD"}, want: "0.005"},
		{name: "OK_KWDLarge", money: order.Money{Minor: 123456, Currency: "KWD"}, want: "123.456"},
		{name: "OK_MaxInt64", money: order.Money{Minor: math.MaxInt64, Currency: "EUR"}, want: "92233720368547758.07"},
		{name: "OK_Negative", money: order.Money{Minor: -5, Currency: "EUR"}, want: "-0.05"},
		{name: "OK_MinInt64", money: order.Money{Minor: math.MinInt64, Currency: "EUR"}, want: "-92233720368547758.08"},
		{name: "OK_Zero", money: order.Money{Minor: 0, Currency: "KWD"}, want: "0.000"},
		{name: "OK_UnknownCurrencyUnscaled", money: order.Money{Minor: 1999, Currency: "ZZZ"}, want: "1999"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.money.Decimal(); got != tt.want {
				t.Fatalf("%+v.Decimal() = %q, want %q", tt.money, got, tt.want)
			}
			if tt.money.Minor <= 0 || tt.money.Currency == "ZZZ" {
				return
			}
			back, err := order.ParseMoney(tt.money.Decimal(), tt.money.Currency)
			if err != nil || back != tt.money {
				t.Errorf("ParseMoney(Decimal()) = %+v, %v; want %+v", back, err, tt.money)
			}
		})
	}
}

func TestMoneyString(t *testing.T) {
	m := order.Money{Minor: 1999, Currency: "EUR"}
	if got, want := m.String(), "19.99 EUR"; got != want {
		t.Errorf("String() = %q, want %q", got, want)
	}
}

// requireValidationError fails the test unless err is a *ValidationError
// naming field.
func requireValidationError(t *testing.T, err error, field string) {
	t.Helper()
	var verr *order.ValidationError
	if !errors.As(err, &verr) {
		t.Fatalf("error = %v (%T), want a *order.ValidationError", err, err)
	}
	if verr.Field != field {
		t.Fatalf("error %q has Field %q, want %q", err, verr.Field, field)
	}
	if verr.Rule == "" {
		t.Fatalf("error %q has an empty Rule", err)
	}
}

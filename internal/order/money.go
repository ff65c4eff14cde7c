package order

import (
	"math"
	"strconv"

	"github.com/bojanz/currency"
)

// Money is an amount in minor units of an ISO 4217 currency.
//
// Keeping the amount as an integer count of the currency's smallest unit
// (cent, yen, fils) makes it exact and comparable with ==; the currency's
// exponent only matters when converting from or to decimal text.
type Money struct {
	Minor    int64
	Currency string
}

// Bounds on the totalAmount literal. Written plainly, any int64 amount in any
// ISO 4217 currency takes at most 21 bytes, so these only cut off junk, and
// they let ParseMoney reject it before doing any arithmetic: `1e999999999`
// costs as little as `1`.
const (
	maxNumberLen = 64
	maxExponent  = 64
)

// maxInt64Digits is the number of decimal digits in math.MaxInt64; any
// integer with more digits (and no leading zeros) overflows int64.
const maxInt64Digits = 19

// ParseMoney converts number, the text of a JSON number literal in major
// units such as "19.99" or "1e2", into exact minor units of the currency with
// the given ISO 4217 code, using the currency's exponent (JPY 0, EUR 2,
// KWD 3).
//
// The conversion is exact or fails: a number that is not a whole number of
// minor units ("10.001" EUR) is rejected rather than rounded, as is a number
// that is zero, negative, or too large for int64 minor units. No floating
// point is involved. Errors are *ValidationError with Field "currency" or
// "totalAmount".
func ParseMoney(number, code string) (Money, error) {
	digits, err := currencyDigits(code)
	if err != nil {
		return Money{}, err
	}
	minor, err := toMinor(number, digits, code)
	if err != nil {
		return Money{}, err
	}
	return Money{Minor: minor, Currency: code}, nil
}

// Decimal returns the amount in major units as an exact decimal with as many
// fraction digits as the currency has: 1999 EUR is "19.99", 1990 EUR is
// "19.90", 1000 JPY is "1000" and 5 KWD is "0.005". The text is a valid JSON
// number literal. For a currency the currency package does not know, Minor is
// returned unscaled.
func (m Money) Decimal() string {
	return string(m.appendDecimal(nil))
}

// appendDecimal appends the text of Decimal to b.
func (m Money) appendDecimal(b []byte) []byte {
	digits, _ := currency.GetDigits(m.Currency)
	return appendScaled(b, m.Minor, int(digits))
}

// String returns the amount and its currency, such as "19.99 EUR".
func (m Money) String() string {
	return m.Decimal() + " " + m.Currency
}

// validate returns the error ParseMoney would give for m's amount and
// currency, if any.
func (m Money) validate() error {
	if _, err := currencyDigits(m.Currency); err != nil {
		return err
	}
	if m.Minor <= 0 {
		return invalid("totalAmount", "%s is not positive", m.Decimal())
	}
	return nil
}

// currencyDigits returns the ISO 4217 exponent of code. The currency package
// is more lenient than the wire format: IsValid("") is true, and
// currency.Register accepts codes of any shape, so the shape is checked here
// first.
func currencyDigits(code string) (int, error) {
	if len(code) != 3 || !isUpper(code[0]) || !isUpper(code[1]) || !isUpper(code[2]) {
		return 0, invalid("currency", "%s is not three upper-case letters", clip(code))
	}
	// GetDigits fails exactly when currency.IsValid does (or code is empty).
	digits, ok := currency.GetDigits(code)
	if !ok {
		return 0, invalid("currency", "%s is not a known ISO 4217 currency", code)
	}
	return int(digits), nil
}

func isUpper(c byte) bool { return 'A' <= c && c <= 'Z' }

// toMinor converts the JSON number literal s to an integer number of minor
// units, where one major unit is 10^digits minor units.
//
// The arithmetic is done on the decimal digits themselves rather than with
// bojanz/currency or apd: currency.Amount rounds surplus fraction digits away
// (19.999 EUR would become 2000), and a big-decimal library would have to be
// bounded separately. Working on at most maxNumberLen digits, it needs no
// heap allocation.
func toMinor(s string, digits int, code string) (int64, error) {
	if len(s) > maxNumberLen {
		return 0, invalid("totalAmount", "number literal is %d bytes, limit %d", len(s), maxNumberLen)
	}
	var buf [maxNumberLen]byte
	n, ok := parseNumber(s, &buf)
	if !ok {
		return 0, invalid("totalAmount", "%s is not a JSON number", clip(s))
	}
	if n.exp < -maxExponent || n.exp > maxExponent {
		return 0, invalid("totalAmount", "exponent of %s is out of range %d..%d", s, -maxExponent, maxExponent)
	}
	if n.neg || len(n.coef) == 0 {
		return 0, invalid("totalAmount", "%s is not positive", s)
	}

	// The amount in minor units is coef × 10^shift.
	coef, shift := n.coef, n.exp-n.fracLen+digits
	if shift < 0 {
		// The last -shift digits of coef are below one minor unit and must
		// all be zero. coef has no leading zeros, so if it has no more than
		// -shift digits it cannot be a whole number of minor units.
		keep := len(coef) + shift
		if keep <= 0 || !allZero(coef[keep:]) {
			return 0, invalid("totalAmount", "%s has more decimal places than %s allows (%d)", s, code, digits)
		}
		coef, shift = coef[:keep], 0
	}
	// A number of more than 19 digits is at least 10^19 > MaxInt64. Below
	// that it fits in a uint64, so the loops below cannot wrap.
	if len(coef)+shift > maxInt64Digits {
		return 0, overflow(s, code)
	}
	var v uint64
	for _, c := range coef {
		v = v*10 + uint64(c-'0')
	}
	for range shift {
		v *= 10
	}
	if v > math.MaxInt64 {
		return 0, overflow(s, code)
	}
	return int64(v), nil
}

func overflow(s, code string) *ValidationError {
	return invalid("totalAmount", "%s is too large for int64 %s minor units", s, code)
}

func allZero(b []byte) bool {
	for _, c := range b {
		if c != '0' {
			return false
		}
	}
	return true
}

// number is a JSON number literal taken apart: its value is
// (−1 if neg) × coef × 10^(exp − fracLen).
type number struct {
	neg     bool
	coef    []byte // integer and fraction digits, leading zeros removed; empty for zero
	fracLen int    // how many of the original digits came after the decimal point
	exp     int    // the written exponent, saturated beyond maxExponent in magnitude
}

// parseNumber parses s, which must follow the JSON number grammar
// -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?, and copies its digits into
// buf, which must hold len(s) bytes.
func parseNumber(s string, buf *[maxNumberLen]byte) (number, bool) {
	var n number
	i := 0
	if i < len(s) && s[i] == '-' {
		n.neg = true
		i++
	}
	digits := buf[:0]

	start := i
	for i < len(s) && isDigit(s[i]) {
		i++
	}
	switch {
	case i == start:
		return number{}, false
	case s[start] == '0' && i-start > 1:
		return number{}, false // leading zero
	}
	digits = append(digits, s[start:i]...)

	if i < len(s) && s[i] == '.' {
		i++
		start = i
		for i < len(s) && isDigit(s[i]) {
			i++
		}
		if i == start {
			return number{}, false
		}
		digits = append(digits, s[start:i]...)
		n.fracLen = i - start
	}

	if i < len(s) && (s[i] == 'e' || s[i] == 'E') {
		i++
		expNeg := false
		if i < len(s) && (s[i] == '+' || s[i] == '-') {
			expNeg = s[i] == '-'
			i++
		}
		start = i
		for ; i < len(s) && isDigit(s[i]); i++ {
			// Saturate: any value past maxExponent is rejected anyway, and
			// stopping here keeps a long run of digits from overflowing.
			if n.exp <= maxExponent {
				n.exp = n.exp*10 + int(s[i]-'0')
			}
		}
		if i == start {
			return number{}, false
		}
		if expNeg {
			n.exp = -n.exp
		}
	}
	if i != len(s) {
		return number{}, false
	}

	for len(digits) > 0 && digits[0] == '0' {
		digits = digits[1:]
	}
	n.coef = digits
	return n, true
}

func isDigit(c byte) bool { return '0' <= c && c <= '9' }

// appendScaled appends minor / 10^digits to dst as an exact decimal with
// exactly digits fraction digits.
func appendScaled(dst []byte, minor int64, digits int) []byte {
	// uint64 holds the magnitude of every int64, including math.MinInt64.
	mag := uint64(minor)
	if minor < 0 {
		dst = append(dst, '-')
		mag = -mag
	}
	var buf [maxInt64Digits + 1]byte
	s := strconv.AppendUint(buf[:0], mag, 10)
	if digits == 0 {
		return append(dst, s...)
	}
	if len(s) <= digits {
		dst = append(dst, "0."...)
		for range digits - len(s) {
			dst = append(dst, '0')
		}
		return append(dst, s...)
	}
	point := len(s) - digits
	dst = append(dst, s[:point]...)
	dst = append(dst, '.')
	return append(dst, s[point:]...)
}

package order

import (
	"errors"
	"testing"
)

// TestDecodeMalformed feeds the scanner input that json.Valid would have
// rejected. Parse never does that, but should the two ever disagree, the
// scanner must report malformed JSON rather than panic, loop or misread.
func TestDecodeMalformed(t *testing.T) {
	tests := []struct {
		name  string
		input string
	}{
		{name: "ErrEmpty", input: ""},
		{name: "ErrOpenBrace", input: "{"},
		{name: "ErrUnterminatedKey", input: `{"eventId`},
		{name: "ErrKeyNotString", input: `{eventId:1}`},
		{name: "ErrMissingColon", input: `{"a" 1}`},
		{name: "ErrMissingValue", input: `{"a":`},
		{name: "ErrBadValue", input: `{"a":x}`},
		{name: "ErrTruncatedLiteral", input: `{"a":tru`},
		{name: "ErrUnterminatedString", input: `{"a":"abc`},
		{name: "ErrEscapeAtEnd", input: `{"a":"\`},
		{name: "ErrBadEscape", input: `{"a\q":1}`},
		{name: "ErrUnterminatedObject", input: `{"a":{"b":[1,2}`},
		{name: "ErrUnterminatedStringInObject", input: `{"a":{"b":"}`},
		{name: "ErrMissingComma", input: `{"a":1 "b":2}`},
		{name: "ErrNoClosingBrace", input: `{"a":1`},
		{name: "ErrTopLevelGarbage", input: `x`},
		{name: "ErrSignOnlyID", input: `{"orderId":-}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var d decoder
			err := d.decode([]byte(tt.input))
			var verr *ValidationError
			if !errors.As(err, &verr) || *verr != *malformed() {
				t.Fatalf("decode(%q) = %v, want %v", tt.input, err, malformed())
			}
		})
	}
}

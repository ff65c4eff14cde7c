package order

import (
	"fmt"
	"strconv"
)

// ValidationError says which rule an event broke. Its Error text is used
// verbatim as the human-readable part of a dead-letter reason, so it names the
// field and the offending value (clipped, see clip) in one short line.
type ValidationError struct {
	// Field is the wire name of the offending field, or "" when the rule
	// concerns the whole value (empty, too large, not one JSON object, or a
	// duplicated unknown field). It is always one of the schema's field names
	// or "", never text taken from the input, so it is safe to use as a metric
	// label or in a switch.
	Field string
	// Rule describes the broken rule and the value that broke it.
	Rule string
}

// Error returns "Field: Rule", or just Rule when Field is empty.
func (e *ValidationError) Error() string {
	if e.Field == "" {
		return e.Rule
	}
	return e.Field + ": " + e.Rule
}

// invalid builds a *ValidationError. It returns the concrete type so that
// callers which promise "every error is a *ValidationError" keep that promise
// visible in the code.
func invalid(field, format string, args ...any) *ValidationError {
	return &ValidationError{Field: field, Rule: fmt.Sprintf(format, args...)}
}

// maxEcho bounds how much of an offending value an error message repeats:
// enough to recognise it in a dead-letter queue, never the whole 64 KiB.
const maxEcho = 40

// clip returns b Go-quoted and shortened to maxEcho bytes, so that error
// text stays one short printable line whatever the input contains.
func clip[T ~string | ~[]byte](b T) string {
	if len(b) > maxEcho {
		return strconv.Quote(string(b[:maxEcho])) + "..."
	}
	return strconv.Quote(string(b))
}

// clipNumber is clip for text that is known to be a JSON number: it is
// printed bare, as in `totalAmount: 10.001 has ...`, because a number needs
// no quoting to be unambiguous.
func clipNumber[T ~string | ~[]byte](b T) string {
	if len(b) > maxEcho {
		return string(b[:maxEcho]) + "..."
	}
	return string(b)
}

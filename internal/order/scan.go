package order

// This file is a small JSON scanner that finds what encoding/json cannot
// tell: a member name given twice in one object, and a name that matches a
// field only case-insensitively (encoding/json matches case-insensitively
// and keeps the last duplicate). Both must be rejected: two values for
// totalAmount would make what is charged depend on the decoder.
// encoding/json/v2 does all of it (jsontext rejects duplicate names,
// json.Unmarshal can match case-sensitively), but in Go 1.26 it is still
// behind GOEXPERIMENT=jsonv2. Remove this file once encoding/json/v2 is in
// the standard library without the experiment flag: decode with it and
// drop scan.go and scan_internal_test.go.

import (
	"bytes"
	"encoding/json"
)

// kind is the JSON type of a value.
type kind uint8

const (
	kindString kind = iota
	kindNumber
	kindBool
	kindNull
	kindObject
	kindArray
)

func (k kind) String() string {
	switch k {
	case kindString:
		return "string"
	case kindNumber:
		return "number"
	case kindBool:
		return "boolean"
	case kindNull:
		return "null"
	case kindObject:
		return "object"
	default:
		return "array"
	}
}

// value is one JSON value as it appears in the input.
type value struct {
	kind kind
	// raw is the value's text; for a string it includes the quotes and any
	// escape sequences.
	raw     []byte
	escaped bool // a string containing at least one backslash escape
}

// text returns the contents of a string value. Escape sequences are rare in
// events, so the common case is a subslice of the input, and the rare case is
// left to encoding/json so that escapes, surrogate pairs and lone surrogates
// mean exactly what they mean to every other encoding/json consumer.
func (v value) text() ([]byte, error) {
	if !v.escaped {
		return v.raw[1 : len(v.raw)-1], nil
	}
	var s string
	if err := json.Unmarshal(v.raw, &s); err != nil {
		return nil, malformed()
	}
	return []byte(s), nil
}

// malformed is the error for JSON that the scanner cannot follow. Parse only
// scans input that json.Valid has accepted, so this signals a disagreement
// between the two; it must still be an invalid event, not a panic or a
// misread value.
func malformed() *ValidationError {
	return &ValidationError{Rule: "malformed JSON"}
}

// scanner finds the token boundaries of a JSON text. It leaves checking the
// grammar to json.Valid, but it checks bounds everywhere, so even input it
// does not understand cannot make it panic or loop.
type scanner struct {
	data []byte
	pos  int
}

func (s *scanner) skipSpace() {
	for s.pos < len(s.data) {
		switch s.data[s.pos] {
		case ' ', '\t', '\n', '\r':
			s.pos++
		default:
			return
		}
	}
}

// peek returns the next byte, or 0 at the end of the input.
func (s *scanner) peek() byte {
	if s.pos < len(s.data) {
		return s.data[s.pos]
	}
	return 0
}

// consume advances past c if it is the next byte.
func (s *scanner) consume(c byte) bool {
	if s.peek() != c {
		return false
	}
	s.pos++
	return true
}

// value reads the value that starts at the current position.
func (s *scanner) value() (value, bool) {
	start := s.pos
	var v value
	ok := true
	switch c := s.peek(); {
	case c == '"':
		v.kind = kindString
		v.escaped, ok = s.skipString()
	case c == '{':
		v.kind = kindObject
		ok = s.skipNested()
	case c == '[':
		v.kind = kindArray
		ok = s.skipNested()
	case c == 't':
		v.kind = kindBool
		ok = s.skipLiteral("true")
	case c == 'f':
		v.kind = kindBool
		ok = s.skipLiteral("false")
	case c == 'n':
		v.kind = kindNull
		ok = s.skipLiteral("null")
	case c == '-' || isDigit(c):
		v.kind = kindNumber
		for s.pos < len(s.data) && isNumberByte(s.data[s.pos]) {
			s.pos++
		}
	default:
		ok = false
	}
	v.raw = s.data[start:s.pos]
	return v, ok
}

func isNumberByte(c byte) bool {
	return isDigit(c) || c == '-' || c == '+' || c == '.' || c == 'e' || c == 'E'
}

// skipString moves past the string that starts at the current position and
// reports whether it contains escape sequences.
func (s *scanner) skipString() (escaped, ok bool) {
	for i := s.pos + 1; i < len(s.data); i++ {
		switch s.data[i] {
		case '"':
			s.pos = i + 1
			return escaped, true
		case '\\':
			// Skip the escaped byte, which may be a quote or a backslash.
			// The hex digits of \uXXXX need no special care.
			escaped = true
			i++
		}
	}
	return false, false
}

// skipNested moves past the object or array that starts at the current
// position. It counts brackets instead of recursing, so deep nesting costs
// no stack.
func (s *scanner) skipNested() bool {
	depth := 0
	for s.pos < len(s.data) {
		switch s.data[s.pos] {
		case '"':
			if _, ok := s.skipString(); !ok {
				return false
			}
			continue
		case '{', '[':
			depth++
		case '}', ']':
			depth--
			if depth == 0 {
				s.pos++
				return true
			}
		}
		s.pos++
	}
	return false
}

func (s *scanner) skipLiteral(lit string) bool {
	if !bytes.HasPrefix(s.data[s.pos:], []byte(lit)) {
		return false
	}
	s.pos += len(lit)
	return true
}

package migrationlint

import (
	"strings"
	"unicode"
	"unicode/utf8"
)

// tokenKind tells what a token is; comments and white space are dropped.
type tokenKind int

const (
	word   tokenKind = iota // a keyword or unquoted identifier, lower-cased
	ident                   // a "quoted identifier", as written inside the quotes
	str                     // a 'string' (E'', B'', X'' too), its value
	dollar                  // a $tag$ body $tag$, its body
	number
	punct // one character, or `::`
)

type token struct {
	kind tokenKind
	text string
}

// tokenize splits one statement into tokens. It knows PostgreSQL's lexical
// rules only as far as the rules need: comments (nested /* */ too), quoted
// identifiers, strings with doubled quotes, dollar quotes. Unknown characters
// become punctuation.
func tokenize(sql string) []token {
	var out []token
	for i := 0; i < len(sql); {
		c := sql[i]
		switch {
		case c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f':
			i++
		case strings.HasPrefix(sql[i:], "--"):
			j := strings.IndexByte(sql[i:], '\n')
			if j < 0 {
				return out
			}
			i += j + 1
		case strings.HasPrefix(sql[i:], "/*"):
			depth := 0
			for i < len(sql) {
				if strings.HasPrefix(sql[i:], "/*") {
					depth++
					i += 2
				} else if strings.HasPrefix(sql[i:], "*/") {
					depth--
					i += 2
					if depth == 0 {
						break
					}
				} else {
					i++
				}
			}
		case c == '\'':
			v, n := quoted(sql[i:], '\'')
			out = append(out, token{str, v})
			i += n
		case c == '"':
			v, n := quoted(sql[i:], '"')
			out = append(out, token{ident, v})
			i += n
		case (c == 'e' || c == 'E' || c == 'b' || c == 'B' || c == 'x' || c == 'X') && i+1 < len(sql) && sql[i+1] == '\'':
			v, n := quoted(sql[i+1:], '\'')
			out = append(out, token{str, v})
			i += 1 + n
		case c == '$':
			if tag, ok := dollarTag(sql[i:]); ok {
				rest := sql[i+len(tag):]
				end := strings.Index(rest, tag)
				if end < 0 {
					out = append(out, token{dollar, rest})
					return out
				}
				out = append(out, token{dollar, rest[:end]})
				i += len(tag) + end + len(tag)
				continue
			}
			j := i + 1 // $1, a parameter
			for j < len(sql) && sql[j] >= '0' && sql[j] <= '9' {
				j++
			}
			out = append(out, token{punct, sql[i:j]})
			i = j
		case c >= '0' && c <= '9':
			j := i
			for j < len(sql) && (sql[j] >= '0' && sql[j] <= '9' || sql[j] == '.') {
				j++
			}
			out = append(out, token{number, sql[i:j]})
			i = j
		case isIdentStart(sql[i:]):
			j := i
			for j < len(sql) {
				r, size := utf8.DecodeRuneInString(sql[j:])
				if !(r == '_' || r == '$' || unicode.IsLetter(r) || unicode.IsDigit(r)) {
					break
				}
				j += size
			}
			out = append(out, token{word, strings.ToLower(sql[i:j])})
			i = j
		case strings.HasPrefix(sql[i:], "::"):
			out = append(out, token{punct, "::"})
			i += 2
		default:
			_, size := utf8.DecodeRuneInString(sql[i:])
			out = append(out, token{punct, sql[i : i+size]})
			i += size
		}
	}
	return out
}

func isIdentStart(s string) bool {
	r, _ := utf8.DecodeRuneInString(s)
	return r == '_' || unicode.IsLetter(r)
}

// quoted reads a string or identifier that starts at s[0] == q, where a
// doubled quote stands for one; it returns the value and the bytes read.
func quoted(s string, q byte) (string, int) {
	var b strings.Builder
	for i := 1; i < len(s); i++ {
		if s[i] == q {
			if i+1 < len(s) && s[i+1] == q {
				b.WriteByte(q)
				i++
				continue
			}
			return b.String(), i + 1
		}
		b.WriteByte(s[i])
	}
	return b.String(), len(s)
}

// dollarTag returns the $tag$ that s starts with, if it starts with one.
func dollarTag(s string) (string, bool) {
	for i := 1; i < len(s); i++ {
		c := s[i]
		if c == '$' {
			return s[:i+1], true
		}
		if !(c == '_' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || i > 1 && c >= '0' && c <= '9') {
			return "", false
		}
	}
	return "", false
}

// name returns the identifier t stands for: a word or a quoted identifier.
func (t token) name() (string, bool) {
	if t.kind == word || t.kind == ident {
		return t.text, true
	}
	return "", false
}

// is reports whether t is one of the keywords.
func (t token) is(keywords ...string) bool {
	if t.kind != word {
		return false
	}
	for _, k := range keywords {
		if t.text == k {
			return true
		}
	}
	return false
}

// tokens is a statement's tokens with the lookups the rules make.
type tokens []token

// at returns the i-th token, or an empty punctuation token past the end,
// so that lookahead needs no bounds checks.
func (ts tokens) at(i int) token {
	if i < 0 || i >= len(ts) {
		return token{kind: punct}
	}
	return ts[i]
}

// seq reports whether the tokens from i on are the keywords kws.
func (ts tokens) seq(i int, kws ...string) bool {
	for j, k := range kws {
		if !ts.at(i + j).is(k) {
			return false
		}
	}
	return true
}

// has reports whether the keyword occurs at parenthesis depth 0.
func (ts tokens) has(kw string) bool {
	depth := 0
	for _, t := range ts {
		switch {
		case t.kind == punct && t.text == "(":
			depth++
		case t.kind == punct && t.text == ")":
			depth--
		case depth == 0 && t.is(kw):
			return true
		}
	}
	return false
}

// qualifiedName reads a possibly schema-qualified name at i and returns its
// last part (billing's objects live in one schema) and the index after it.
func (ts tokens) qualifiedName(i int) (string, int) {
	n, ok := ts.at(i).name()
	if !ok {
		return "", i
	}
	i++
	for ts.at(i).kind == punct && ts.at(i).text == "." {
		next, ok := ts.at(i + 1).name()
		if !ok {
			break
		}
		n = next
		i += 2
	}
	return n, i
}

// splitTopLevel splits ts at commas outside parentheses: the actions of an
// ALTER TABLE, the names of a DROP.
func (ts tokens) splitTopLevel() []tokens {
	var parts []tokens
	depth, from := 0, 0
	for i, t := range ts {
		if t.kind != punct {
			continue
		}
		switch t.text {
		case "(":
			depth++
		case ")":
			depth--
		case ",", ";":
			if depth == 0 {
				if i > from {
					parts = append(parts, ts[from:i])
				}
				from = i + 1
			}
		}
	}
	if from < len(ts) {
		parts = append(parts, ts[from:])
	}
	return parts
}

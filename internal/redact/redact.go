// Package redact masks passwords in connection strings before they reach a
// log line or an error message. It is a leaf: config (which validates the
// strings) and postgres (which connects with them) both use it without
// depending on each other.
package redact

import (
	"net/url"
	"regexp"
)

var kvPassword = regexp.MustCompile(`(password\s*=\s*)('(?:[^'\\]|\\.)*'|\S+)`)

// urlPassword finds the password in a URL's user info where url.Parse
// cannot help: a URL it rejects (a bad port or escape elsewhere in it), or
// a parser's error message that quotes the URL.
var urlPassword = regexp.MustCompile(`([a-zA-Z][a-zA-Z0-9+.-]*://[^/?#@\s"':]*:)[^\s"]*@`)

// DSN returns s with its passwords masked: s is a URL (postgres://, http://,
// ...), a PostgreSQL key=value DSN, or a message that quotes either.
func DSN(s string) string {
	if u, err := url.Parse(s); err == nil && u.Scheme != "" {
		if q := u.Query(); q.Has("password") {
			q.Set("password", "xxxxx")
			u.RawQuery = q.Encode()
		}
		return u.Redacted()
	}
	s = urlPassword.ReplaceAllString(s, "${1}xxxxx@")
	return kvPassword.ReplaceAllString(s, "${1}xxxxx")
}

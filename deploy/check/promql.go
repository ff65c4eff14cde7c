package check

import (
	"regexp"
	"strings"
)

// promqlWords are PromQL's keywords and aggregation operators: words of an
// expression that are not metric names.
var promqlWords = map[string]bool{
	"by": true, "without": true, "on": true, "ignoring": true, "group_left": true, "group_right": true,
	"bool": true, "and": true, "or": true, "unless": true, "offset": true, "atan2": true,
	"sum": true, "min": true, "max": true, "avg": true, "group": true, "stddev": true, "stdvar": true,
	"count": true, "count_values": true, "bottomk": true, "topk": true, "quantile": true,
	"limitk": true, "limit_ratio": true, "inf": true, "nan": true,
}

var (
	promqlStrings  = regexp.MustCompile(`"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'|` + "`[^`]*`")
	promqlGrouping = regexp.MustCompile(`\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)`)
	promqlBraces   = regexp.MustCompile(`\{[^}]*\}`)
	promqlRanges   = regexp.MustCompile(`\[[^\]]*\]`)
	promqlVars     = regexp.MustCompile(`\$\{?\w+\}?`)
	promqlToken    = regexp.MustCompile(`[0-9][0-9a-zA-Z_.]*|[a-zA-Z_:][a-zA-Z0-9_:]*\s*\(?`)
)

// MetricNames returns the metric names a PromQL expression selects: the
// identifiers that are not functions, keywords, label names, label values,
// durations or numbers. It is a scanner, not a parser, and good enough for
// the expressions of billing's alerts and dashboard.
func MetricNames(expr string) []string {
	s := promqlStrings.ReplaceAllString(expr, `""`)
	s = promqlGrouping.ReplaceAllString(s, " ")
	s = promqlBraces.ReplaceAllString(s, " ")
	s = promqlRanges.ReplaceAllString(s, " ")
	s = promqlVars.ReplaceAllString(s, " ")
	var names []string
	for _, tok := range promqlToken.FindAllString(s, -1) {
		switch {
		case tok[0] >= '0' && tok[0] <= '9': // a number or a duration
		case strings.HasSuffix(tok, "("): // a function
		case promqlWords[strings.ToLower(strings.TrimSpace(tok))]:
		default:
			names = append(names, strings.TrimSpace(tok))
		}
	}
	return names
}

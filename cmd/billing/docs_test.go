package main

import (
	"flag"
	"fmt"
	"strings"
)

var update = flag.Bool("update", false, "rewrite the generated documentation: docs/configuration.md from the configuration structs, the Kafka ACLs of docs/deployment.md from internal/kafkaacl")

// markdownText escapes what a table cell would otherwise take for markup:
// "<key>" would vanish as an HTML tag, "|" would end the cell.
func markdownText(s string) string {
	return strings.NewReplacer("<", "&lt;", ">", "&gt;", "|", `\|`).Replace(s)
}

// firstDifference shows the first line where got and want differ.
func firstDifference(got, want string) string {
	g, w := strings.Split(got, "\n"), strings.Split(want, "\n")
	for i := 0; i < max(len(g), len(w)); i++ {
		var gl, wl string
		if i < len(g) {
			gl = g[i]
		}
		if i < len(w) {
			wl = w[i]
		}
		if gl != wl {
			return fmt.Sprintf("line %d:\n  file:    %q\n  structs: %q", i+1, gl, wl)
		}
	}
	return ""
}

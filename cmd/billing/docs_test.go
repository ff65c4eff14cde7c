package main

import (
	"bytes"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"example.com/billing/internal/config"
)

var update = flag.Bool("update", false, "rewrite the generated documentation: docs/configuration.md from the configuration structs, the Kafka ACLs of docs/deployment.md from internal/kafkaacl")

// configurationReference is docs/configuration.md, relative to this
// package.
var configurationReference = filepath.Join("..", "..", "docs", "configuration.md")

// TestConfigurationReference fails when docs/configuration.md and the
// configuration structs disagree: a variable missing from either side, or
// another default or meaning. The file is generated from the structs: run
// this test with -update to rewrite it.
func TestConfigurationReference(t *testing.T) {
	t.Parallel()
	want := configurationMarkdown()
	if *update {
		if err := os.WriteFile(configurationReference, want, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	got, err := os.ReadFile(configurationReference)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("%s disagrees with the configuration structs; rewrite it with\n"+
			"  go test ./cmd/billing -run TestConfigurationReference -update\n%s",
			configurationReference, firstDifference(string(got), string(want)))
	}
}

// configurationMarkdown writes the configuration reference: every variable
// of every command configured by the environment, with its default and
// meaning, grouped by command.
func configurationMarkdown() []byte {
	var b bytes.Buffer
	b.WriteString(`# Configuration

<!-- Generated from the configuration structs (their env, envDefault and help
tags) by: go test ./cmd/billing -run TestConfigurationReference -update
Do not edit by hand: that test fails when this file and the structs disagree. -->

Every command reads its settings from the environment, once, at start. A
missing or bad value stops it with a message that names every variable at
fault. Secrets (` + "`PAYMENT_API_KEY`, `KAFKA_SASL_PASSWORD`, the password in\n`DATABASE_URL`" + `) are masked in logs and never reach metrics.
` + "`billing <command> -h`" + ` prints the same list for one command, with an
example.

`)
	for _, c := range envCommands {
		fmt.Fprintf(&b, "- [billing %s](#billing-%s)\n", strings.Join(c.args, " "), strings.Join(c.args, "-"))
	}
	for _, c := range envCommands {
		fmt.Fprintf(&b, "\n## billing %s\n\n", strings.Join(c.args, " "))
		if c.note != "" {
			b.WriteString(c.note + "\n\n")
		}
		b.WriteString("| variable | default | meaning |\n| --- | --- | --- |\n")
		for _, v := range config.Vars(c.cfg) {
			def := "—"
			switch {
			case v.Required:
				def = "required"
			case v.Default != "":
				def = "`" + v.Default + "`"
			}
			fmt.Fprintf(&b, "| `%s` | %s | %s |\n", v.Name, def, markdownText(v.Help))
		}
	}
	return b.Bytes()
}

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

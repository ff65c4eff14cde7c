package main

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/IBM/sarama"

	"example.com/billing/internal/config"
	"example.com/billing/internal/kafkaacl"
)

// deploymentGuide is docs/deployment.md, relative to this package.
var deploymentGuide = filepath.Join("..", "..", "docs", "deployment.md")

// The markers around the generated part of docs/deployment.md.
const (
	aclBegin = "<!-- Kafka ACLs: generated from internal/kafkaacl by\n" +
		"go test ./cmd/billing -run TestACLReference -update; do not edit by hand. -->\n"
	aclEnd = "<!-- end of the generated Kafka ACLs -->\n"
)

// aclCommand is a command that talks to Kafka, with the principal the guide
// gives it.
type aclCommand struct {
	name, principal string
	acls            func(config.Kafka) []kafkaacl.ACL
}

var aclCommands = []aclCommand{
	{"billing serve", "User:billing", kafkaacl.Serve},
	{"billing dlq replay", "User:billing-dlq-replay", func(k config.Kafka) []kafkaacl.ACL {
		return kafkaacl.Replay(k, kafkaacl.ReplayGroupPrefix(k))
	}},
	{"billing explain", "User:billing-explain", kafkaacl.Explain},
	{"billing produce", "User:billing-produce", kafkaacl.Produce},
}

// TestACLReference fails when the Kafka ACLs of docs/deployment.md (the
// table and the kafka-acls.sh lines) are not exactly the lists billing
// checks at start, for its default names. The part between the markers is
// generated: run this test with -update to rewrite it.
func TestACLReference(t *testing.T) {
	t.Parallel()
	doc, err := os.ReadFile(deploymentGuide)
	if err != nil {
		t.Fatal(err)
	}
	begin, end := bytes.Index(doc, []byte(aclBegin)), bytes.Index(doc, []byte(aclEnd))
	if begin < 0 || end < begin {
		t.Fatalf("%s lacks the markers of the generated Kafka ACLs:\n%s...\n%s", deploymentGuide, aclBegin, aclEnd)
	}
	got := string(doc[begin+len(aclBegin) : end])
	want := aclMarkdown(t)
	if *update {
		out := append(append(append([]byte{}, doc[:begin+len(aclBegin)]...), want...), doc[end:]...)
		if err := os.WriteFile(deploymentGuide, out, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	if got != want {
		t.Errorf("the Kafka ACLs of %s disagree with internal/kafkaacl; rewrite them with\n"+
			"  go test ./cmd/billing -run TestACLReference -update\n%s", deploymentGuide, firstDifference(got, want))
	}
}

// aclMarkdown is the table of every command's ACLs and the kafka-acls.sh
// lines that grant them.
func aclMarkdown(t *testing.T) string {
	var k config.Kafka
	if err := config.Load(map[string]string{}, &k); err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	b.WriteString("\n| command | resource | name | pattern | operation | why |\n| --- | --- | --- | --- | --- | --- |\n")
	for _, c := range aclCommands {
		for _, a := range c.acls(k) {
			res, pattern, op := a.Resource, a.Pattern, a.Operation
			fmt.Fprintf(&b, "| `%s` | %s | `%s` | %s | %s | %s |\n", c.name, res.String(), a.Name, strings.ToUpper(pattern.String()), op.String(), markdownText(a.Why))
		}
	}
	b.WriteString("\nThe same with Kafka's own tool, as a super user (`$ADMIN`: its client properties; `$BOOTSTRAP`: the brokers):\n\n```sh\n")
	for _, c := range aclCommands {
		fmt.Fprintf(&b, "# %s\n", c.name)
		// One line per resource, its operations together.
		type resource struct {
			res     sarama.AclResourceType
			pattern sarama.AclResourcePatternType
			name    string
		}
		var order []resource
		ops := map[resource][]string{}
		for _, a := range c.acls(k) {
			r := resource{a.Resource, a.Pattern, a.Name}
			if _, ok := ops[r]; !ok {
				order = append(order, r)
			}
			op := a.Operation
			ops[r] = append(ops[r], "--operation "+op.String())
		}
		for _, r := range order {
			flag := "--topic"
			if r.res == sarama.AclResourceGroup {
				flag = "--group"
			}
			pattern := ""
			if r.pattern == sarama.AclPatternPrefixed {
				pattern = " --resource-pattern-type prefixed"
			}
			fmt.Fprintf(&b, "kafka-acls.sh --bootstrap-server \"$BOOTSTRAP\" --command-config \"$ADMIN\" --add --allow-principal %s \\\n  %s%s %s %s\n",
				c.principal, strings.Join(ops[r], " "), pattern, flag, r.name)
		}
	}
	b.WriteString("```\n\n")
	return b.String()
}

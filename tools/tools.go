//go:build tools

// Package tools pins the versions of billing's development tools in a module
// of their own, so that they never leak into the service's dependencies.
package tools

import (
	_ "golang.org/x/vuln/cmd/govulncheck"
	_ "honnef.co/go/tools/cmd/staticcheck"
)

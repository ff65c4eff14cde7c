// Package migrations embeds billing's SQL migrations so that the binary
// carries its own schema: `billing migrate` needs no files on disk.
package migrations

import "embed"

// FS holds the goose migration files, applied in lexical (version) order.
//
//go:embed *.sql
var FS embed.FS

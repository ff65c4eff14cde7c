// Package migrations embeds billing's SQL migrations so that the binary
// carries its own schema: `billing migrate` needs no files on disk.
package migrations

import (
	"embed"
	"io/fs"
)

//go:embed *.sql
var files embed.FS

// FS holds the goose migration files, applied in lexical (version) order.
var FS fs.FS = files

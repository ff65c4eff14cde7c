//go:build !dev

package main

// developerCommands: none in the build that ships (no tag: make build, the
// image), so that it links no fake broker, no fake provider and no
// PostgreSQL downloader; the developer build has them (dev.go).
func developerCommands() []subcommand { return nil }

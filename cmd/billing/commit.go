//go:build !seeddesign

package main

// seedDesign: this build is billing's. A build with -tags seeddesign is the
// seed design's commit for the benchmark (commit_seeddesign.go).
const seedDesign = false

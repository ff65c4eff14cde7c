//go:build seeddesign

package main

// seedDesign: this build commits each message's offset synchronously, with
// no position in the database, as the seed's kafkajs consumer commits
// after every message: the benchmark's seed design (bench/throughput),
// never a deployment.
const seedDesign = true

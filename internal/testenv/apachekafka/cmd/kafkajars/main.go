// Command kafkajars resolves the Apache Kafka pinned in test/kafka/pom.xml
// into the cache the tests, the chaos suite and the benchmark use, and
// prints where the jars are (make kafka).
package main

import (
	"context"
	"fmt"
	"os"
	"time"

	"example.com/billing/internal/testenv/apachekafka"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "kafkajars:", err)
		os.Exit(1)
	}
}

func run() error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	started := time.Now()
	jars, err := apachekafka.PinnedJars(ctx)
	if err != nil {
		return err
	}
	fmt.Printf("Apache Kafka jars in %s (%s)\n", jars, time.Since(started).Round(100*time.Millisecond))
	return nil
}

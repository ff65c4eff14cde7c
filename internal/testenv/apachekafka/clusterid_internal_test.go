package apachekafka

import (
	"encoding/base64"
	"testing"
)

// kafka-storage format reads "--cluster-id -abc..." as a missing argument:
// a random id starting with '-' (one in 64) failed a chaos run's start.
func TestClusterID_NeverStartsWithADash(t *testing.T) {
	for range 10_000 {
		id := clusterID()
		if id[0] == '-' {
			t.Fatalf("cluster id %q starts with '-'", id)
		}
		if b, err := base64.RawURLEncoding.DecodeString(id); err != nil || len(b) != 16 {
			t.Fatalf("cluster id %q is not 16 bytes of URL-safe base64: %v", id, err)
		}
	}
}

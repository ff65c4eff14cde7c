package kafka_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"

	"example.com/billing/internal/kafka"
	"example.com/billing/internal/testenv/kafkatest"
)

// loadingCoordinator is a broker whose group coordinator answers the first
// busy offset fetches with COORDINATOR_LOAD_IN_PROGRESS (a negative busy:
// all of them), as Kafka does while it loads a group's offsets after a
// broker restart or a leader moving back. It returns a client of it, with
// 7 committed on every partition of topic, and the count of fetches.
func loadingCoordinator(t *testing.T, group, topic string, busy int64) (sarama.Client, *atomic.Int64) {
	t.Helper()
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(2, topic))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cluster.Close)
	client := kafkatest.Client(t, strings.Join(cluster.ListenAddrs(), ","))
	// A simple commit (no member, generation -1): kfake, unlike Kafka,
	// answers an offset manager's first fetch of a new group with an error.
	coordinator, err := client.Coordinator(group)
	if err != nil {
		t.Fatal(err)
	}
	commit := &sarama.OffsetCommitRequest{Version: 2, ConsumerGroup: group, ConsumerGroupGeneration: -1}
	for p := range int32(2) {
		commit.AddBlock(topic, p, 7, 0, "")
	}
	resp, err := coordinator.CommitOffset(commit)
	if err != nil {
		t.Fatal(err)
	}
	for _, blocks := range resp.Errors {
		for p, kerr := range blocks {
			if kerr != sarama.ErrNoError {
				t.Fatalf("commit on %s/%d: %v", topic, p, kerr)
			}
		}
	}

	var fetches atomic.Int64
	cluster.ControlKey(int16(kmsg.OffsetFetch), func(r kmsg.Request) (kmsg.Response, error, bool) {
		cluster.KeepControl()
		if n := fetches.Add(1); busy >= 0 && n > busy {
			return nil, nil, false // answered as usual
		}
		req := r.(*kmsg.OffsetFetchRequest)
		resp := req.ResponseKind().(*kmsg.OffsetFetchResponse)
		resp.Version = req.Version
		code := kerr.CoordinatorLoadInProgress.Code
		if req.Version >= 8 {
			for _, g := range req.Groups {
				rg := kmsg.NewOffsetFetchResponseGroup()
				rg.Group, rg.ErrorCode = g.Group, code
				resp.Groups = append(resp.Groups, rg)
			}
		} else {
			resp.ErrorCode = code
		}
		return resp, nil, true
	})
	return client, &fetches
}

// A coordinator loading the group's offsets answers within seconds: the
// committed offsets are read once it has, not failed on its first answer
// (a dlq replay or a check would fail on a healthy cluster).
func TestCommittedOffsets_WaitsForACoordinatorLoadingOffsets(t *testing.T) {
	t.Parallel()
	client, fetches := loadingCoordinator(t, "g", "t", 3)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	got, err := kafka.CommittedOffsets(ctx, client, "g", "t")
	if err != nil {
		t.Fatalf("CommittedOffsets: %v", err)
	}
	if want := map[int32]int64{0: 7, 1: 7}; len(got) != len(want) || got[0] != want[0] || got[1] != want[1] {
		t.Errorf("committed offsets %v, want %v", got, want)
	}
	if n := fetches.Load(); n != 4 {
		t.Errorf("%d offset fetches, want 4 (3 busy answers, then the offsets)", n)
	}
}

// A coordinator that stays busy past the caller's patience is an error
// that says so: the coordinator's answer, not only the deadline.
func TestCommittedOffsets_SaysTheCoordinatorWasBusyWhenTheContextEnds(t *testing.T) {
	t.Parallel()
	client, _ := loadingCoordinator(t, "g", "t", -1)
	ctx, cancel := context.WithTimeout(t.Context(), time.Second)
	defer cancel()
	_, err := kafka.CommittedOffsets(ctx, client, "g", "t")
	if !errors.Is(err, sarama.ErrOffsetsLoadInProgress) || !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("CommittedOffsets = %v, want the coordinator's loading error and the deadline", err)
	}
}

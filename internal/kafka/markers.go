package kafka

// A producer that writes in Kafka transactions (Spring Kafka, Kafka
// Streams, Kafka Connect's exactly-once sources, kafkajs, librdkafka,
// franz-go) ends every transaction with a marker on each partition it
// wrote to: a control record that commits or aborts the transaction. A
// marker occupies an offset but is handed to no consumer, and neither, to
// one that reads committed records, is a record of an aborted
// transaction. The commit rule marks the offset after the last message
// billing finished, so a partition whose last records are markers (every
// partition such a producer wrote to, once it is idle) would stay one
// short of its end for ever, and its lag would never be 0.
//
// sarama's partition consumer steps over those offsets internally but
// does not say how far it went. So an idle partition whose finished prefix
// stops below its high-water mark is looked at: one read_committed fetch
// from the end of the prefix (FirstReadable) shows whether everything up to
// some offset is markers and aborted records, and the consumer (package
// consumer, markers.go) then marks the partition up to there. Never past
// a record that is handed to consumers: those are billing's to finish,
// under the commit rule.

import (
	"errors"
	"fmt"
	"slices"

	"github.com/IBM/sarama"
)

// markerFetchBytes bounds the fetch that looks past a partition's finished
// prefix: markers are a few dozen bytes each, and a larger batch means
// records to hand out, which the claim delivers anyway.
const markerFetchBytes = 64 << 10

// FirstReadable returns the first offset at or after from that is not a
// transaction marker or a record of an aborted transaction, as far as one
// read_committed fetch from the partition's leader shows: from itself
// when the record there is one a consumer is handed (or nothing follows).
// A reader that has read a partition up to from and is handed nothing more
// is at the partition's end when it returns the end offset.
func FirstReadable(client sarama.Client, topic string, partition int32, from int64) (int64, error) {
	leader, err := client.Leader(topic, partition)
	if err != nil {
		return 0, err
	}
	req := &sarama.FetchRequest{Version: fetchVersion(client.Config().Version), MaxBytes: markerFetchBytes, Isolation: sarama.ReadCommitted}
	if req.Version >= 7 {
		req.SessionID, req.SessionEpoch = 0, -1 // no fetch session
	}
	req.AddBlock(topic, partition, from, markerFetchBytes, -1)
	resp, err := leader.Fetch(req)
	if err != nil {
		return 0, fmt.Errorf("fetch %s/%d from %d: %w", topic, partition, from, err)
	}
	block := resp.GetBlock(topic, partition)
	if block == nil {
		return 0, sarama.ErrIncompleteResponse
	}
	if !errors.Is(block.Err, sarama.ErrNoError) {
		return 0, fmt.Errorf("fetch %s/%d from %d: %w", topic, partition, from, block.Err)
	}
	var batches []*sarama.RecordBatch
	for _, r := range block.RecordsSet {
		if r.RecordBatch == nil {
			break // a message set of the old format: no transactions there
		}
		batches = append(batches, r.RecordBatch)
	}
	return stepOver(from, batches, block.AbortedTransactions), nil
}

// fetchVersion is the Fetch request version for brokers of version v: at
// least 4, which brings the isolation level; 11 from Kafka 2.3 on, as
// sarama's own consumer sends.
func fetchVersion(v sarama.KafkaVersion) int16 {
	if v.IsAtLeast(sarama.V2_3_0_0) {
		return 11
	}
	return 4
}

// stepOver returns the offset that batches, fetched read_committed from
// from, show to be the first one a consumer is handed, or the offset after
// them when all are markers or records of aborted transactions. aborted are
// the aborted transactions the fetch reported: a producer's transactional
// batches from its transaction's first offset up to its marker are
// aborted.
func stepOver(from int64, batches []*sarama.RecordBatch, aborted []*sarama.AbortedTransaction) int64 {
	aborted = slices.SortedFunc(slices.Values(aborted), func(a, b *sarama.AbortedTransaction) int {
		return int(min(max(a.FirstOffset-b.FirstOffset, -1), 1))
	})
	open := map[int64]bool{} // producers whose aborted transaction is under way
	next := from
	for _, b := range batches {
		for len(aborted) > 0 && aborted[0].FirstOffset <= b.LastOffset() {
			open[aborted[0].ProducerID] = true
			aborted = aborted[1:]
		}
		switch {
		case b.Control:
			delete(open, b.ProducerID) // the transaction ends here
		case b.LastOffset() < next:
			// Before from: a fetch returns the whole batch that holds it.
		case b.IsTransactional && open[b.ProducerID]:
			// Records of an aborted transaction.
		default:
			return next
		}
		next = max(next, b.LastOffset()+1)
	}
	return next
}

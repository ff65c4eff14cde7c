package kafka

import (
	"testing"

	"github.com/IBM/sarama"
)

func TestStepOver(t *testing.T) {
	// Producers 7 and 9 write in transactions; 0 is a plain producer.
	data := func(first, last int64) *sarama.RecordBatch {
		return &sarama.RecordBatch{FirstOffset: first, LastOffsetDelta: int32(last - first), ProducerID: 0}
	}
	txn := func(pid, first, last int64) *sarama.RecordBatch {
		return &sarama.RecordBatch{FirstOffset: first, LastOffsetDelta: int32(last - first), ProducerID: pid, IsTransactional: true}
	}
	marker := func(pid, at int64) *sarama.RecordBatch {
		return &sarama.RecordBatch{FirstOffset: at, ProducerID: pid, IsTransactional: true, Control: true}
	}
	aborted := func(pid, first int64) *sarama.AbortedTransaction {
		return &sarama.AbortedTransaction{ProducerID: pid, FirstOffset: first}
	}
	tests := []struct {
		name    string
		from    int64
		batches []*sarama.RecordBatch
		aborted []*sarama.AbortedTransaction
		want    int64
	}{
		{name: "NothingFetched", from: 10, want: 10},
		{name: "ARecordIsNext", from: 10, batches: []*sarama.RecordBatch{data(10, 12)}, want: 10},
		{name: "ACommitMarkerAtTheEnd", from: 10, batches: []*sarama.RecordBatch{marker(7, 10)}, want: 11},
		{name: "MarkersOfTwoProducers", from: 10, batches: []*sarama.RecordBatch{marker(7, 10), marker(9, 11)}, want: 12},
		{name: "AMarkerThenARecord", from: 10, batches: []*sarama.RecordBatch{marker(7, 10), data(11, 11)}, want: 11},
		{name: "ACommittedTransactionIsHandedOut", from: 10, batches: []*sarama.RecordBatch{txn(7, 10, 14), marker(7, 15)}, want: 10},
		{
			name: "AnAbortedTransactionAndItsMarker", from: 10,
			batches: []*sarama.RecordBatch{txn(7, 10, 14), marker(7, 15)},
			aborted: []*sarama.AbortedTransaction{aborted(7, 10)},
			want:    16,
		},
		{
			name: "AnAbortedTransactionThenACommittedOneOfTheSameProducer", from: 10,
			batches: []*sarama.RecordBatch{txn(7, 10, 14), marker(7, 15), txn(7, 16, 17), marker(7, 18)},
			aborted: []*sarama.AbortedTransaction{aborted(7, 10)},
			want:    16,
		},
		{
			name: "AnotherProducersRecordsInsideAnAbortedTransaction", from: 10,
			batches: []*sarama.RecordBatch{txn(7, 10, 11), txn(9, 12, 12), txn(7, 13, 13), marker(7, 14)},
			aborted: []*sarama.AbortedTransaction{aborted(7, 10)},
			want:    12,
		},
		{
			name: "TheBatchHoldingFromStartsBeforeIt", from: 12,
			batches: []*sarama.RecordBatch{txn(7, 10, 14), marker(7, 15)},
			aborted: []*sarama.AbortedTransaction{aborted(7, 10)},
			want:    16,
		},
		{
			name: "ARecordBatchHoldingFromIsNotSteppedOver", from: 12,
			batches: []*sarama.RecordBatch{data(10, 14), marker(7, 15)},
			want:    12,
		},
		{
			name: "AnAbortMarkerBeforeFromEndsThatTransaction", from: 16,
			batches: []*sarama.RecordBatch{marker(7, 15), txn(7, 16, 17)},
			aborted: []*sarama.AbortedTransaction{aborted(7, 10)},
			want:    16,
		},
		{
			name: "AbortedTransactionsOutOfOrder", from: 10,
			batches: []*sarama.RecordBatch{txn(9, 10, 10), txn(7, 11, 11), marker(9, 12), marker(7, 13)},
			aborted: []*sarama.AbortedTransaction{aborted(7, 11), aborted(9, 10)},
			want:    14,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := stepOver(tt.from, tt.batches, tt.aborted); got != tt.want {
				t.Errorf("stepOver(%d) = %d, want %d", tt.from, got, tt.want)
			}
		})
	}
}

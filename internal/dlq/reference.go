package dlq

// This file resolves a reference (reason oversize) back to its original in
// the source topic, or says why it is gone.

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/IBM/sarama"

	"example.com/billing/internal/dlq/reason"
)

// isReference reports whether m stands for an original too large to park
// (Writer.Park's reference).
func isReference(m *sarama.ConsumerMessage) bool {
	return reason.Parse(Header(m.Headers, HeaderReason)).Code == reason.Oversize && Header(m.Headers, HeaderOriginalSHA256) != ""
}

// goneError says why a reference's original cannot be fetched back.
type goneError struct{ msg string }

func (e *goneError) Error() string { return e.msg }

// original fetches the message reference ref stands for from the source
// topic, at the partition and offset it names, and checks its size and
// SHA-256. It is gone when retention (or compaction) removed it.
func (r *replayer) original(ctx context.Context, ref *sarama.ConsumerMessage) (*sarama.ConsumerMessage, error) {
	topic := Header(ref.Headers, HeaderOriginalTopic)
	part, perr := strconv.ParseInt(Header(ref.Headers, HeaderOriginalPartition), 10, 32)
	off, oerr := strconv.ParseInt(Header(ref.Headers, HeaderOriginalOffset), 10, 64)
	if topic == "" || perr != nil || oerr != nil {
		return nil, &goneError{fmt.Sprintf("reference %s/%d@%d does not name its original's topic, partition and offset", ref.Topic, ref.Partition, ref.Offset)}
	}
	where := fmt.Sprintf("%s/%d@%d", topic, part, off)
	oldest, err := r.client.GetOffset(topic, int32(part), sarama.OffsetOldest)
	if err != nil {
		return nil, fmt.Errorf("dlq replay: oldest offset of %s/%d: %w", topic, part, err)
	}
	if off < oldest {
		return nil, &goneError{fmt.Sprintf("%s is gone: the topic's retention removed it (the partition now starts at offset %d)", where, oldest)}
	}
	consumer, err := sarama.NewConsumerFromClient(r.client)
	if err != nil {
		return nil, fmt.Errorf("dlq replay: %w", err)
	}
	defer consumer.Close()
	pc, err := consumer.ConsumePartition(topic, int32(part), off)
	if errors.Is(err, sarama.ErrOffsetOutOfRange) {
		return nil, &goneError{fmt.Sprintf("%s is gone: the topic no longer holds that offset", where)}
	}
	if err != nil {
		return nil, fmt.Errorf("dlq replay: read %s: %w", where, err)
	}
	defer pc.Close()
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	select {
	case m := <-pc.Messages():
		sum := sha256.Sum256(m.Value)
		if m.Offset != off || strconv.Itoa(len(m.Value)) != Header(ref.Headers, HeaderOriginalSize) ||
			hex.EncodeToString(sum[:]) != Header(ref.Headers, HeaderOriginalSHA256) {
			return nil, &goneError{fmt.Sprintf("%s is gone: the topic holds another message there now (offset %d, %d bytes, other SHA-256)", where, m.Offset, len(m.Value))}
		}
		return m, nil
	case cerr := <-pc.Errors():
		return nil, fmt.Errorf("dlq replay: read %s: %w", where, cerr)
	case <-ctx.Done():
		return nil, fmt.Errorf("dlq replay: read %s: %w", where, context.Cause(ctx))
	}
}

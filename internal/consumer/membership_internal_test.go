package consumer

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// The membership is confirmed once a confirmInterval, one heartbeat at a
// time: an answered heartbeat does not send the next at once. Before, each
// answer sent the next, and an idle serve spent half a core on heartbeats.
func TestMembership_SendsAHeartbeatEachInterval(t *testing.T) {
	t.Parallel()
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cluster.Close)
	var beats atomic.Int64
	cluster.ControlKey(int16(kmsg.Heartbeat), func(kmsg.Request) (kmsg.Response, error, bool) {
		cluster.KeepControl()
		beats.Add(1)
		return nil, nil, false // counted, answered as usual (an unknown member)
	})
	cfg := sarama.NewConfig()
	cfg.Version = sarama.V3_6_0_0
	client, err := sarama.NewClient(cluster.ListenAddrs(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = client.Close() })

	m := newMembership(client, "g")
	m.begin(idleSession{})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { m.run(ctx); close(done) }()
	const over = 3*confirmInterval + confirmInterval/2
	time.Sleep(over)
	cancel()
	<-done
	if n := beats.Load(); n < 2 || n > 4 {
		t.Errorf("%d heartbeats in %s, want one per %s", n, over, confirmInterval)
	}
}

// idleSession is a group session of a member that consumes nothing.
type idleSession struct{ sarama.ConsumerGroupSession }

func (idleSession) MemberID() string         { return "member" }
func (idleSession) GenerationID() int32      { return 1 }
func (idleSession) Context() context.Context { return context.Background() }

import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.HexFormat;
import java.util.List;
import java.util.Properties;
import java.util.concurrent.Future;

import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.clients.producer.RecordMetadata;
import org.apache.kafka.common.serialization.ByteArraySerializer;

/**
 * An order service that publishes through Apache Kafka's own transactional
 * producer (kafka-clients), driven one command per line on stdin, one answer
 * per line on stdout, so that billing's tests can write, commit, abort and
 * leave transactions open exactly as a Java service does.
 *
 * <p>Arguments: bootstrap servers, transactional.id, transaction.timeout.ms.
 * Prints "ready" once the producer holds its transactional id. Commands:
 * "begin"; "send TOPIC PARTITION KEY VALUE" (hex, "-" for null; not waited
 * for); "flush" and "commit" answer "ok" and the offsets of the records sent
 * since the last answer that gave offsets; "abort". A failure answers
 * "error" and its message; the producer may then have to be started again,
 * as a Java service would.
 */
public final class TxnProducer {
    public static void main(String[] args) throws Exception {
        Properties p = new Properties();
        p.put(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, args[0]);
        p.put(ProducerConfig.TRANSACTIONAL_ID_CONFIG, args[1]);
        p.put(ProducerConfig.TRANSACTION_TIMEOUT_CONFIG, args[2]);
        p.put(ProducerConfig.KEY_SERIALIZER_CLASS_CONFIG, ByteArraySerializer.class.getName());
        p.put(ProducerConfig.VALUE_SERIALIZER_CLASS_CONFIG, ByteArraySerializer.class.getName());
        p.put(ProducerConfig.ACKS_CONFIG, "all");
        p.put(ProducerConfig.LINGER_MS_CONFIG, "5");
        HexFormat hex = HexFormat.of();
        try (KafkaProducer<byte[], byte[]> producer = new KafkaProducer<>(p)) {
            producer.initTransactions();
            System.out.println("ready");
            System.out.flush();
            List<Future<RecordMetadata>> sent = new ArrayList<>();
            BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
            for (String line; (line = in.readLine()) != null; ) {
                String[] f = line.trim().split(" ");
                String answer;
                try {
                    switch (f[0]) {
                        case "begin" -> {
                            producer.beginTransaction();
                            answer = "ok";
                        }
                        case "send" -> {
                            byte[] key = f[3].equals("-") ? null : hex.parseHex(f[3]);
                            byte[] value = f[4].equals("-") ? null : hex.parseHex(f[4]);
                            sent.add(producer.send(new ProducerRecord<>(f[1], Integer.parseInt(f[2]), key, value)));
                            answer = "ok";
                        }
                        case "flush" -> {
                            producer.flush();
                            answer = offsets(sent);
                        }
                        case "commit" -> {
                            producer.commitTransaction();
                            answer = offsets(sent);
                        }
                        case "abort" -> {
                            producer.abortTransaction();
                            sent.clear();
                            answer = "ok";
                        }
                        default -> answer = "error unknown command " + f[0];
                    }
                } catch (Exception e) {
                    answer = "error " + (e.toString()).replace('\n', ' ');
                }
                System.out.println(answer);
                System.out.flush();
            }
        }
    }

    private static String offsets(List<Future<RecordMetadata>> sent) throws Exception {
        StringBuilder b = new StringBuilder("ok");
        for (Future<RecordMetadata> f : sent) {
            b.append(' ').append(f.get().offset());
        }
        sent.clear();
        return b.toString();
    }
}

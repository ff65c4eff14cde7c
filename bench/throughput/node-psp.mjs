// A payment provider stub in Node.js, as a seed written in TypeScript
// would have one: node:http's createServer with its defaults (listen
// backlog 511, keep-alive 5 s), one setTimeout per request, Stripe-like
// idempotency in a Map. bench/throughput runs it as a process of its own
// with -provider node, to compare billing against it with fakepsp.
//
// POST /v1/charges answers after LATENCY_MS: a new key creates a charge
// (200), the same key with the same body replays the answer, with another
// body 422, while in flight 409. GET /_stats answers fakepsp's Stats
// fields the benchmark reads. Listens on 127.0.0.1:PORT.
import http from 'node:http';

const latency = Number(process.env.LATENCY_MS ?? 0);
const port = Number(process.env.PORT ?? 0);

const keys = new Map(); // Idempotency-Key -> { raw, status, answer }
const chargesPerOrder = new Map();
const stats = {
  requests: 0, distinctKeys: 0, chargesCreated: 0, declines: 0, replays: 0, conflicts: 0,
  mismatches: 0, badRequests: 0, unauthorized: 0, injectedFailures: 0, downRejections: 0,
  rateLimited: 0, resets: 0, ordersChargedTwice: 0, peakPerSecond: 0,
};
let seq = 0;

function send(res, status, body, headers = {}) {
  res.writeHead(status, { 'Content-Type': 'application/json', ...headers });
  res.end(JSON.stringify(body));
}

const server = http.createServer((req, res) => {
  if (req.method === 'GET' && req.url === '/_stats') {
    send(res, 200, stats);
    return;
  }
  if (req.method !== 'POST' || req.url !== '/v1/charges') {
    send(res, 404, { error: { type: 'invalid_request_error', message: 'not found' } });
    return;
  }
  stats.requests++;
  const chunks = [];
  req.on('data', (c) => chunks.push(c));
  req.on('end', () => {
    const raw = Buffer.concat(chunks).toString();
    const key = req.headers['idempotency-key'];
    let body = null;
    try {
      body = JSON.parse(raw);
    } catch {
      body = null;
    }
    const seen = key ? keys.get(key) : undefined;
    if (!key || !body) {
      setTimeout(() => {
        stats.badRequests++;
        send(res, 400, { error: { type: 'invalid_request_error', message: 'bad request' } });
      }, latency);
      return;
    }
    if (seen) {
      setTimeout(() => {
        if (seen.raw !== raw) {
          stats.mismatches++;
          send(res, 422, { error: { type: 'idempotency_error', message: 'key reused with another body' } });
        } else if (!seen.answer) {
          stats.conflicts++;
          send(res, 409, { error: { type: 'idempotency_error', message: 'in flight' } });
        } else {
          stats.replays++;
          send(res, seen.status, seen.answer, { 'Idempotent-Replayed': 'true' });
        }
      }, latency);
      return;
    }
    const entry = { raw, status: 0, answer: null };
    keys.set(key, entry);
    setTimeout(() => {
      entry.status = 200;
      entry.answer = { id: 'ch_' + (++seq).toString(36), status: 'succeeded' };
      stats.chargesCreated++;
      stats.distinctKeys++;
      const n = (chargesPerOrder.get(body.orderId) ?? 0) + 1;
      chargesPerOrder.set(body.orderId, n);
      if (n === 2) stats.ordersChargedTwice++;
      send(res, entry.status, entry.answer);
    }, latency);
  });
});

server.listen(port, '127.0.0.1');
process.on('SIGTERM', () => process.exit(0));

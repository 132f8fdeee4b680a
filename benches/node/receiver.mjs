// A plain Node webhook receiver: the comparison the performance issue names for
// ingest. Each delivery: the HMAC checked (X-Signature over "timestamp.body"), the
// body parsed, then one transaction on a pooled connection: the event id claimed
// (INSERT .. ON CONFLICT DO NOTHING), and if it was new the resource upserted with the
// version guard in SQL. Answers {"outcome":"applied"|"stale"|"duplicate"} as the
// product does. No group commit, no change-feed publish (the trigger on `resources`
// still fills change_pending), no dead letters, no limits on clients.
//
//   node receiver.mjs DATABASE_URL SECRET POOL_SIZE
//
// Prints {"port":N} on stdout once it listens on 127.0.0.1.
import crypto from 'node:crypto';
import http from 'node:http';
import pg from 'pg';

const [databaseUrl, secret, poolSize] = process.argv.slice(2);
const pool = new pg.Pool({ connectionString: databaseUrl, max: Number(poolSize) });

const KINDS = {
  'order.updated': { kind: 'order', id: (d) => d.order_id, version: (d) => d.version },
  'refund.succeeded': { kind: 'refund', id: (d) => d.refund_id, version: () => 0 },
};
const CLAIM = `INSERT INTO processed_events (source, event_id, event_type, outcome, kind, resource_id)
  VALUES ('shop', $1, $2, 'applied', $3, $4) ON CONFLICT DO NOTHING`;
const UPSERT = `INSERT INTO resources (source, account, kind, id, version, state, deleted, origin, last_event_id)
  VALUES ('shop', '', $1, $2, $3, $4::jsonb, false, 'webhook', $5)
  ON CONFLICT (source, account, kind, id) DO UPDATE SET version = excluded.version,
    state = excluded.state, state_digest = NULL, deleted = false, origin = excluded.origin,
    last_event_id = excluded.last_event_id, updated_at = now()
  WHERE resources.version < excluded.version`;
const STALE = `UPDATE processed_events SET outcome = 'stale' WHERE source = 'shop' AND event_id = $1`;

function answer(res, status, outcome) {
  res.writeHead(status, { 'content-type': 'application/json' });
  res.end(outcome ? JSON.stringify({ outcome }) : '');
}

async function apply(event) {
  const k = KINDS[event.type];
  if (!k) return 'ignored';
  const c = await pool.connect();
  try {
    await c.query('BEGIN');
    const id = String(k.id(event.data));
    const claim = await c.query(CLAIM, [event.id, event.type, k.kind, id]);
    let outcome = 'duplicate';
    if (claim.rowCount === 1) {
      const w = await c.query(UPSERT, [k.kind, id, k.version(event.data), JSON.stringify(event.data), event.id]);
      outcome = w.rowCount === 1 ? 'applied' : 'stale';
      if (outcome === 'stale') await c.query(STALE, [event.id]);
    }
    await c.query('COMMIT');
    return outcome;
  } catch (e) {
    await c.query('ROLLBACK').catch(() => {});
    throw e;
  } finally {
    c.release();
  }
}

const server = http.createServer(async (req, res) => {
  const chunks = [];
  for await (const chunk of req) chunks.push(chunk);
  const body = Buffer.concat(chunks);
  const ts = String(req.headers['x-signature-timestamp'] ?? '');
  const sig = Buffer.from(String(req.headers['x-signature'] ?? ''));
  const want = Buffer.from(
    crypto.createHmac('sha256', secret).update(`${ts}.`).update(body).digest('hex'),
  );
  const fresh = Math.abs(Date.now() / 1000 - Number(ts)) <= 300;
  if (!fresh || sig.length !== want.length || !crypto.timingSafeEqual(sig, want)) {
    return answer(res, 401);
  }
  let event;
  try {
    event = JSON.parse(body);
  } catch {
    return answer(res, 400);
  }
  try {
    answer(res, 200, await apply(event));
  } catch (e) {
    console.error(e.message);
    answer(res, 503);
  }
});
server.keepAliveTimeout = 60_000;
server.listen(0, '127.0.0.1', () => {
  console.log(JSON.stringify({ port: server.address().port }));
});

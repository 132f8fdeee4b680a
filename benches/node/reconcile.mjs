// A plain Node reconciler: the comparison the performance issue names for a sweep.
// It pages through the sender's cursor listing one page after another, reads the
// local versions of the page's ids, and writes the missing and newer items (the
// version guard in SQL) with the page's checkpoint in one transaction: batch upserts,
// no state digest, no change-feed publish (the trigger on `resources` still fills
// change_pending), no lease, no run record. After the last page it detects deletions
// as the benchmark's kind asks (`detect_deletes`): the live ids not listed, read in
// pages of 10,000, are tombstoned unless written since the sweep began.
//
//   node reconcile.mjs SENDER_BASE_URL DATABASE_URL
//
// Prints {"scanned":N,"applied":N,"tombstoned":N,"seconds":S} on stdout.
import pg from 'pg';

const [base, databaseUrl] = process.argv.slice(2);
const client = new pg.Client({ connectionString: databaseUrl });
await client.connect();

const READ = `SELECT id, version FROM resources
  WHERE source = 'bench' AND account = '' AND kind = 'item' AND id = ANY($1)`;
const UPSERT = `INSERT INTO resources (source, account, kind, id, version, state, deleted, origin)
  SELECT 'bench', '', 'item', i, v, s::jsonb, false, 'reconcile'
  FROM unnest($1::text[], $2::bigint[], $3::text[]) AS t(i, v, s)
  ON CONFLICT (source, account, kind, id) DO UPDATE SET version = excluded.version,
    state = excluded.state, state_digest = NULL, deleted = false, origin = excluded.origin,
    updated_at = now()
  WHERE resources.version < excluded.version`;
const CHECKPOINT = `INSERT INTO reconcile_checkpoints (source, kind, position, sweep_started_at, account)
  VALUES ('bench', 'item', $1, now(), '') ON CONFLICT (source, account, kind) DO UPDATE SET
  position = excluded.position, sweep_started_at = excluded.sweep_started_at, updated_at = now()`;

const started = process.hrtime.bigint();
const sweepStarted = (await client.query('SELECT now() AS t')).rows[0].t;
const seen = new Set();
let cursor = null;
let scanned = 0;
let applied = 0;
for (;;) {
  const url = new URL(`${base}/items`);
  url.searchParams.set('limit', '1000');
  if (cursor !== null) url.searchParams.set('cursor', cursor);
  const res = await fetch(url);
  if (!res.ok) throw new Error(`${url}: HTTP ${res.status}`);
  const page = await res.json();
  const items = page.data;
  const ids = items.map((i) => String(i.id));
  const { rows } = await client.query(READ, [ids]);
  const local = new Map(rows.map((r) => [r.id, Number(r.version)]));
  for (const r of rows) seen.add(r.id);
  const drift = items.filter((i) => !(local.get(String(i.id)) >= i.version));
  await client.query('BEGIN');
  if (drift.length > 0) {
    const r = await client.query(UPSERT, [
      drift.map((i) => String(i.id)),
      drift.map((i) => i.version),
      drift.map((i) => JSON.stringify(i)),
    ]);
    applied += r.rowCount;
  }
  await client.query(CHECKPOINT, [`cursor:${cursor ?? ''}`]);
  await client.query('COMMIT');
  scanned += items.length;
  cursor = page.next_cursor;
  if (cursor === null || cursor === undefined || cursor === '') break;
}
const LIVE = `SELECT id FROM resources WHERE source = 'bench' AND account = '' AND kind = 'item'
  AND NOT deleted AND updated_at < $1 AND id > $2 ORDER BY id LIMIT 10000`;
const unseen = [];
for (let after = ''; ; ) {
  const { rows } = await client.query(LIVE, [sweepStarted, after]);
  if (rows.length === 0) break;
  for (const r of rows) if (!seen.has(r.id)) unseen.push(r.id);
  after = rows[rows.length - 1].id;
}
let tombstoned = 0;
if (unseen.length > 0) {
  const r = await client.query(
    `UPDATE resources SET deleted = true, updated_at = now() WHERE source = 'bench' AND account = ''
      AND kind = 'item' AND id = ANY($1) AND updated_at < $2`,
    [unseen, sweepStarted],
  );
  tombstoned = r.rowCount;
}
const seconds = Number(process.hrtime.bigint() - started) / 1e9;
await client.end();
console.log(JSON.stringify({ scanned, applied, tombstoned, seconds }));

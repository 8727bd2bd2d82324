// Shared by the tests: the servers test.sh started (PGHOST, PGPORT, PGUSER, PGDATABASE;
// REDIS_PORT), a pool, and SQL to inject errors.
import pg from 'pg';

export const redisConnection = { host: '127.0.0.1', port: Number(process.env.REDIS_PORT ?? 56380) };

export function newPool(max = 4) {
  const pool = new pg.Pool({ max });
  pool.on('error', () => {}); // an idle connection terminated by a test
  return pool;
}

// A function to raise any SQLSTATE from SQL, as the server would.
export const RAISE_SQL = `
CREATE OR REPLACE FUNCTION public.test_raise(code text) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
  RAISE EXCEPTION 'injected %', code USING ERRCODE = code;
END $$`;

export async function sql(pool, text, values) {
  return (await pool.query(text, values)).rows;
}

/** Resolves to the error fn's promise rejected with, or fails if it resolved. */
export async function rejection(promise) {
  try {
    await promise;
  } catch (err) {
    return err;
  }
  throw new Error('expected a rejection, got a result');
}

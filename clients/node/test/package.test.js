// The package as installed from its packed tarball: where it resolves from, what it
// exports, and its metadata.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readFile } from 'node:fs/promises';
import { fileURLToPath } from 'node:url';
import path from 'node:path';

const root = path.dirname(fileURLToPath(import.meta.resolve('dedup-client/package.json')));

test('dedup-client resolves to the tarball installed in node_modules, not the source tree', () => {
  assert.match(root, /[/\\]node_modules[/\\]dedup-client$/);
  assert.ok(!root.includes('clients/node/node_modules'), root);
  assert.equal(fileURLToPath(import.meta.resolve('dedup-client')), path.join(root, 'index.js'));
  assert.equal(fileURLToPath(import.meta.resolve('dedup-client/bullmq')), path.join(root, 'bullmq.js'));
});

test('package.json: version 0.7.0, PostgreSQL licence, ESM with types, no dependencies', async () => {
  const pkg = JSON.parse(await readFile(path.join(root, 'package.json'), 'utf8'));
  assert.equal(pkg.name, 'dedup-client');
  assert.equal(pkg.version, '0.7.0');
  assert.equal(pkg.license, 'PostgreSQL');
  assert.equal(pkg.type, 'module');
  assert.equal(pkg.exports['.'].types, './index.d.ts');
  assert.equal(pkg.exports['./bullmq'].types, './bullmq.d.ts');
  assert.equal(pkg.dependencies, undefined);
  assert.deepEqual(Object.keys(pkg.peerDependencies).sort(), ['bullmq', 'pg']);
  assert.equal(pkg.peerDependenciesMeta.bullmq.optional, true);
  const licence = await readFile(path.join(root, 'LICENSE'), 'utf8');
  assert.match(licence, /^PostgreSQL License/);
  for (const f of ['README.md', 'CHANGELOG.md', 'index.d.ts', 'bullmq.d.ts']) {
    await readFile(path.join(root, f)); // shipped
  }
});

test('the main entry exports the API and does not load bullmq (an optional peer)', async () => {
  const api = await import('dedup-client');
  assert.deepEqual(Object.keys(api).sort(), [
    'DedupError', 'InTransactionError', 'NotInTransactionError', 'RETRYABLE_SQLSTATES', 'checkJobId', 'claim',
    'complete', 'extendLease', 'lease', 'releaseLease', 'runLeased', 'runOnce',
    'runOnceWithResult',
  ]);
  const source = await readFile(path.join(root, 'index.js'), 'utf8');
  assert.doesNotMatch(source, /from ['"](bullmq|pg)['"]/);
  const { exactlyOnceWorker } = await import('dedup-client/bullmq');
  assert.equal(typeof exactlyOnceWorker, 'function');
});

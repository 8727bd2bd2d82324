// The hand-written .d.ts files, as installed: tsc --strict on types-check.ts, with
// @types/pg and bullmq's own types, library checks included.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { promisify } from 'node:util';

test('the types: tsc --strict compiles types-check.ts against dedup-client and dedup-client/bullmq', async () => {
  const tsc = promisify(execFile)(process.execPath, ['node_modules/typescript/bin/tsc', '--noEmit',
    '--strict', '--module', 'nodenext', '--moduleResolution', 'nodenext', '--target', 'es2022',
    'types-check.ts']);
  const { stdout } = await tsc.catch((err) => assert.fail(`tsc: ${err.stdout}${err.stderr}`));
  assert.equal(stdout, '');
});

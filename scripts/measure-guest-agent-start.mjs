// How long the guest agent takes from spawn until it answers, against `node -e 0` as the floor,
// both measured in the same run, interleaved, so machine load hits them alike (issue 20: the
// agent's start is on the critical path of every cold create).
//
// Usage: node scripts/measure-guest-agent-start.mjs [--bundle dist/guest-agent.mjs]… [--runs 15]
// Reports medians: `node -e 0` (spawn → exit), and for each bundle (several --bundle are measured
// interleaved, to compare builds) its spawn → "listening" (its log line, written once the socket
// listens) and spawn → first GET /health answered.
import { spawn } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { request } from 'node:http';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { parseArgs } from 'node:util';

const { values } = parseArgs({ options: { bundle: { type: 'string', multiple: true, default: ['dist/guest-agent.mjs'] }, runs: { type: 'string', default: '15' } } });
const bundles = values.bundle.map((path) => resolve(path));
const runs = Math.max(1, Math.min(200, Number(values.runs)));
const RUN_LIMIT_MS = 10_000;

function median(values) {
  const sorted = [...values].sort((a, b) => a - b);
  return sorted.length % 2 ? sorted[(sorted.length - 1) / 2] : (sorted[sorted.length / 2 - 1] + sorted[sorted.length / 2]) / 2;
}

function nodeFloor() {
  const started = performance.now();
  return new Promise((done, fail) => {
    const child = spawn(process.execPath, ['-e', '0'], { stdio: 'ignore' });
    child.once('error', fail);
    child.once('exit', () => done(performance.now() - started));
  });
}

function health(socketPath) {
  return new Promise((done) => {
    const req = request({ socketPath, path: '/health', method: 'GET' }, (res) => {
      res.resume();
      res.once('end', () => done(res.statusCode === 200));
    });
    req.once('error', () => done(false));
    req.end();
  });
}

async function agentStart(bundle, dir, index) {
  const socketPath = join(dir, `agent-${index}.sock`);
  const started = performance.now();
  const child = spawn(process.execPath, ['--openssl-config=/dev/null', bundle, '--socket', socketPath], { stdio: ['ignore', 'ignore', 'pipe'], env: { ...process.env, HOME: dir } });
  const deadline = setTimeout(() => child.kill('SIGKILL'), RUN_LIMIT_MS);
  try {
    const listening = await new Promise((done, fail) => {
      let text = '';
      child.stderr.on('data', (chunk) => {
        text += chunk;
        if (text.includes('listening on')) done(performance.now() - started);
      });
      child.once('exit', (code) => fail(new Error(`the agent exited (${code}) before listening: ${text}`)));
    });
    // Health polled from the moment it listens: the first answer is what a create waits for.
    let answered;
    for (let attempt = 0; attempt < 1000 && answered === undefined; attempt++) {
      if (await health(socketPath)) answered = performance.now() - started;
    }
    if (answered === undefined) throw new Error('the agent never answered GET /health');
    return { listening, answered };
  } finally {
    clearTimeout(deadline);
    child.kill('SIGTERM');
    await new Promise((done) => (child.exitCode === null && child.signalCode === null ? child.once('exit', done) : done()));
  }
}

const dir = mkdtempSync(join(tmpdir(), 'nestbox-agent-start-'));
try {
  // One unmeasured round each: the page cache holds node and the bundles from here on.
  await nodeFloor();
  for (const bundle of bundles) await agentStart(bundle, dir, 'warm');
  const floor = [];
  const listening = bundles.map(() => []);
  const answered = bundles.map(() => []);
  for (let index = 0; index < runs; index++) {
    floor.push(await nodeFloor());
    for (const [which, bundle] of bundles.entries()) {
      const agent = await agentStart(bundle, dir, index);
      listening[which].push(agent.listening);
      answered[which].push(agent.answered);
    }
  }
  const f = median(floor);
  console.log(`guest agent start, medians of ${runs} runs:`);
  console.log(`  node -e 0                       ${f.toFixed(1)} ms`);
  for (const [which, bundle] of bundles.entries()) {
    const l = median(listening[which]);
    const a = median(answered[which]);
    console.log(`  ${bundle}`);
    console.log(`    spawn → listening             ${l.toFixed(1)} ms  (${(l - f).toFixed(1)} ms above the floor)`);
    console.log(`    spawn → first /health answer  ${a.toFixed(1)} ms  (${(a - f).toFixed(1)} ms above the floor)`);
  }
} finally {
  rmSync(dir, { recursive: true, force: true });
}

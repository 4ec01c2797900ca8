// `nestbox build`: a client of the native API (no back door). Packs the context directory into
// a tar, uploads it by digest (skipped when the server has it), starts the build and prints its
// log as it happens (Server-Sent Events); exits 0 when the image is built, 1 otherwise.
import { createHash } from 'node:crypto';
import { createReadStream, existsSync, readFileSync } from 'node:fs';
import { mkdtemp, rm, stat } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { pipeline } from 'node:stream/promises';
import { createWriteStream } from 'node:fs';
import { InvalidArgumentError, type Command } from 'commander';
import { ConfigError, type Config } from './config.js';
import { resolveConnection, type ConnectionFlags, type Profile } from './cli/connection.js';
import { egressPolicy, positiveInteger } from './cli/output.js';

export interface BuildArgs {
  tag: string;
  dockerfile?: string;
  buildArgs: Record<string, string>;
  noCache: boolean;
  egress?: { mode: 'allow-all' | 'deny-all' | 'allow-list'; allow?: string[] };
  timeoutSeconds?: number;
  context: string;
}

/** `--build-arg K=V`, repeatable; a bare `K` takes this environment's value, as docker build does. */
function buildArg(value: string, previous: Record<string, string> = {}): Record<string, string> {
  const [k, ...v] = value.split('=');
  if (!k) throw new InvalidArgumentError(`"${value}" is not KEY=VALUE or KEY`);
  return { ...previous, [k]: v.length ? v.join('=') : (process.env[k] ?? '') };
}

export function registerBuildCommand(program: Command, config: () => Config): void {
  program
    .command('build')
    .description('build an image from a Dockerfile and a context directory on the server, printing the build log as it runs')
    .argument('<context>', 'the context directory (. for this one)')
    .requiredOption('-t, --tag <name[:tag]>', 'the image name and tag (default tag: latest)')
    .option('-f, --file <Dockerfile>', 'the Dockerfile, relative to the context', 'Dockerfile')
    .option('--build-arg <K=V>', 'a build argument (repeatable)', buildArg, {})
    .option('--no-cache', 'run every step, reusing no cached one')
    .option('--egress <policy>', 'the build sandbox\'s network: deny-all, allow-all or host,cidr,…', egressPolicy)
    .option('--timeout <seconds>', 'bound on the whole build', positiveInteger)
    .action(async (context: string, opts: { tag: string; file: string; buildArg: Record<string, string>; cache: boolean; egress?: BuildArgs['egress']; timeout?: number }, cmd: Command) => {
      const cfg = config();
      const connection = resolveConnection(cfg, cmd.optsWithGlobals<ConnectionFlags>());
      process.exitCode = await runBuildCommand(connection, { tag: opts.tag, dockerfile: opts.file, buildArgs: opts.buildArg, noCache: !opts.cache, egress: opts.egress, timeoutSeconds: opts.timeout, context });
    });
}

async function fail(res: Response): Promise<never> {
  const body = await res.text();
  let message = body;
  try {
    const parsed = JSON.parse(body) as { error?: { code?: string; message?: string } };
    if (parsed.error) message = `${parsed.error.code}: ${parsed.error.message}`;
  } catch {
    // not JSON: the text as it is
  }
  throw new ConfigError(`${res.status} ${message}`);
}

export async function runBuildCommand(connection: Profile, args: BuildArgs): Promise<number> {
  const { url } = connection;
  const headers = { authorization: `Bearer ${connection.apiKey}` };
  const context = resolve(args.context);
  if (!(await stat(context).catch(() => undefined))?.isDirectory()) throw new ConfigError(`${args.context}: not a directory`);
  const dockerfilePath = resolve(context, args.dockerfile ?? 'Dockerfile');
  if (!existsSync(dockerfilePath)) throw new ConfigError(`${dockerfilePath}: no Dockerfile (give one with -f)`);
  const dockerfile = readFileSync(dockerfilePath, 'utf8');
  const ignoreFile = join(context, '.dockerignore');
  const ignore = existsSync(ignoreFile) ? readFileSync(ignoreFile, 'utf8').split('\n').map((l) => l.trim()).filter((l) => l && !l.startsWith('#')) : [];
  const colon = args.tag.lastIndexOf(':');
  const [name, tag] = colon > 0 && !args.tag.slice(colon).includes('/') ? [args.tag.slice(0, colon), args.tag.slice(colon + 1)] : [args.tag, 'latest'];

  // The context as one gzip tar in a private temp dir, hashed, then uploaded unless already there.
  // tar is loaded here, not at start: every other command would pay for it.
  const { create: createTar } = await import('tar');
  const dir = await mkdtemp(join(tmpdir(), 'nestbox-build-'));
  try {
    const tarPath = join(dir, 'context.tar.gz');
    await pipeline(createTar({ cwd: context, gzip: true, portable: true }, ['.']), createWriteStream(tarPath, { mode: 0o600 }));
    const hash = createHash('sha256');
    await pipeline(createReadStream(tarPath), hash);
    const sha256 = hash.digest('hex');
    const size = (await stat(tarPath)).size;
    const known = await fetch(`${url}/api/v1/build-contexts/${sha256}`, { headers });
    if (known.status === 404) {
      process.stderr.write(`uploading the context (${size} bytes)\n`);
      const put = await fetch(`${url}/api/v1/build-contexts/${sha256}`, {
        method: 'PUT',
        headers: { ...headers, 'content-type': 'application/gzip', 'content-length': String(size) },
        body: createReadStream(tarPath) as unknown as BodyInit,
        duplex: 'half',
      } as RequestInit);
      if (!put.ok) await fail(put);
    } else if (!known.ok) await fail(known);

    const created = await fetch(`${url}/api/v1/builds`, {
      method: 'POST',
      headers: { ...headers, 'content-type': 'application/json' },
      body: JSON.stringify({ name, tags: [tag], dockerfile, contexts: [sha256], buildArgs: args.buildArgs, ignore, noCache: args.noCache, ...(args.egress ? { egress: args.egress } : {}), ...(args.timeoutSeconds ? { timeoutSeconds: args.timeoutSeconds } : {}) }),
    });
    if (!created.ok) await fail(created);
    const build = (await created.json()) as { id: string };
    process.stderr.write(`build ${build.id}\n`);

    // Follow the log; a dropped connection resumes from the last line seen.
    let next = 0;
    for (let attempt = 0; attempt < 20; attempt++) {
      const res = await fetch(`${url}/api/v1/builds/${build.id}/logs?offset=${next}`, { headers: { ...headers, accept: 'text/event-stream' } });
      if (!res.ok || !res.body) await fail(res);
      let buffer = '';
      const decoder = new TextDecoder();
      try {
        for await (const chunk of res.body as unknown as AsyncIterable<Uint8Array>) {
          buffer += decoder.decode(chunk, { stream: true });
          let end: number;
          while ((end = buffer.indexOf('\n\n')) >= 0) {
            const block = buffer.slice(0, end);
            buffer = buffer.slice(end + 2);
            const event = /^event: (\w+)/m.exec(block)?.[1];
            const data = /^data: (.*)$/m.exec(block)?.[1];
            if (!event || !data) continue;
            if (event === 'line') {
              const line = JSON.parse(data) as { offset: number; text: string; stream: string };
              next = line.offset + 1;
              (line.stream === 'stderr' ? process.stderr : process.stdout).write(`${line.text}\n`);
            } else if (event === 'end') {
              const done = JSON.parse(data) as { state: string; imageId: string | null; error: { message: string } | null };
              if (done.state === 'succeeded') {
                console.log(`${name}:${tag} ${done.imageId}`);
                return 0;
              }
              console.error(`build ${done.state}${done.error ? `: ${done.error.message}` : ''}`);
              return 1;
            }
          }
        }
      } catch {
        // the stream broke: resume from `next`
      }
    }
    throw new ConfigError(`lost the log of build ${build.id} too often; see GET /api/v1/builds/${build.id}`);
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
}

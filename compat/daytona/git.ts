// Daytona's git endpoints (daytona.md (c) "Git"), done by running git inside the sandbox
// through core's toolbox (`toolbox.exec`). Arguments always travel as argv (never through a shell), credentials as
// environment variables read by a one-off credential helper, so nothing lands in the sandbox's
// shell history or process arguments.
import { daytonaAccount } from './sandbox-dto.js';
import express, { type Request, type Router } from 'express';
import { errors, type ErrorCode } from '../../core/errors.js';
import type { ToolboxPort } from '../../core/compat-port.js';
import type { ExecResult } from '../../core/guest.js';
import type { ToolboxCall, ToolboxHandler } from './context.js';
import { daemonError, type DaytonaDaemonCode } from './errors.js';

const CREDENTIAL_HELPER = '!f() { test "$1" = get || exit 0; echo "username=$NESTBOX_GIT_USERNAME"; echo "password=$NESTBOX_GIT_PASSWORD"; }; f';

interface GitOptions {
  username?: string;
  password?: string;
  /** Exit codes that are answers rather than failures (e.g. `git config --get` → 1 when unset). */
  okExitCodes?: number[];
  timeoutMs?: number;
}

/** Classify a failed git run into the Daytona daemon code that selects the SDK's error class. */
export function classifyGitFailure(output: string): { code: ErrorCode; daytona?: DaytonaDaemonCode } {
  const o = output.toLowerCase();
  if (o.includes('not a git repository')) return { code: 'not_found', daytona: 'GIT_REPO_NOT_FOUND' };
  if (o.includes('authentication failed') || o.includes('could not read username') || o.includes('invalid username or password')) return { code: 'unauthorized', daytona: 'GIT_AUTH_FAILED' };
  if (/repository .* not found|does not appear to be a git repository|does not exist/.test(o) && o.includes('repository')) return { code: 'not_found', daytona: 'GIT_REPO_NOT_FOUND' };
  if (/a branch named .* already exists|already exists/.test(o) && o.includes('branch')) return { code: 'conflict', daytona: 'GIT_BRANCH_EXISTS' };
  if (o.includes('did not match any file(s) known to git') || /branch .* not found|invalid reference|remote branch .* not found|couldn't find remote ref/.test(o)) return { code: 'not_found', daytona: 'GIT_BRANCH_NOT_FOUND' };
  if (o.includes('conflict')) return { code: 'conflict', daytona: 'GIT_MERGE_CONFLICT' };
  if (o.includes('would be overwritten') || o.includes('please commit your changes or stash them')) return { code: 'conflict', daytona: 'GIT_DIRTY_WORKTREE' };
  if (o.includes('[rejected]') || o.includes('non-fast-forward') || o.includes('failed to push some refs')) return { code: 'conflict', daytona: 'GIT_PUSH_REJECTED' };
  if (o.includes('[remote rejected]')) return { code: 'conflict', daytona: 'GIT_REMOTE_REJECTED' };
  if (o.includes('could not resolve host') || o.includes('unable to access') || o.includes('could not read from remote')) return { code: 'validation_failed', daytona: 'GIT_TRANSPORT_FAILED' };
  return { code: 'validation_failed' };
}

/** Porcelain status letters → Daytona's Status names. */
const STATUS_NAME: Record<string, string> = {
  ' ': 'Unmodified', M: 'Modified', T: 'Modified', A: 'Added', D: 'Deleted', R: 'Renamed', C: 'Copied', U: 'Updated but unmerged', '?': 'Untracked', '!': 'Untracked',
};

export function parsePorcelainStatus(text: string): Record<string, unknown> {
  const lines = text.split('\n').filter(Boolean);
  const head = lines[0]?.startsWith('## ') ? lines.shift()!.slice(3) : '';
  let currentBranch = '';
  let upstream: string | undefined;
  let ahead = 0;
  let behind = 0;
  let detached = false;
  const noCommits = /^(?:No commits yet on|Initial commit on) (.+)$/.exec(head);
  if (noCommits) currentBranch = noCommits[1];
  else if (head.startsWith('HEAD (no branch)')) detached = true;
  else {
    const m = /^(.+?)(?:\.\.\.(\S+))?(?: \[(.*)\])?$/.exec(head);
    if (m) {
      currentBranch = m[1];
      upstream = m[2];
      const a = /ahead (\d+)/.exec(m[3] ?? '');
      const b = /behind (\d+)/.exec(m[3] ?? '');
      ahead = a ? Number(a[1]) : 0;
      behind = b ? Number(b[1]) : 0;
    }
  }
  const fileStatus = lines.map((line) => {
    const x = line[0];
    const y = line[1];
    let name = line.slice(3);
    let extra = '';
    const arrow = name.indexOf(' -> ');
    if (arrow !== -1 && (x === 'R' || x === 'C')) {
      extra = name.slice(0, arrow);
      name = name.slice(arrow + 4);
    }
    return { name, staging: STATUS_NAME[x] ?? 'Unmodified', worktree: STATUS_NAME[y] ?? 'Unmodified', extra };
  });
  return { currentBranch, fileStatus, ahead, behind, branchPublished: upstream !== undefined, ...(upstream ? { upstream } : {}), detached };
}

export function createGitRoutes(toolbox: ToolboxPort, tb: ToolboxHandler): Router {
  const router = express.Router({ mergeParams: true });
  const body = (req: Request): Record<string, unknown> => (req.body && typeof req.body === 'object' ? (req.body as Record<string, unknown>) : {});
  const str = (v: unknown, field: string): string => {
    if (typeof v !== 'string' || v === '') throw errors.validation(field, 'is required');
    return v;
  };
  const opt = (v: unknown): string | undefined => (typeof v === 'string' && v !== '' ? v : undefined);
  const list = (v: unknown, field: string): string[] => {
    if (v === undefined || v === null) return [];
    if (!Array.isArray(v) || v.some((x) => typeof x !== 'string')) throw errors.validation(field, 'must be an array of strings');
    return v as string[];
  };

  async function git(c: ToolboxCall, cwd: string | undefined, args: string[], o: GitOptions = {}): Promise<ExecResult> {
    const env: Record<string, string> = { GIT_TERMINAL_PROMPT: '0' };
    const pre: string[] = [];
    if (o.username !== undefined || o.password !== undefined) {
      env.NESTBOX_GIT_USERNAME = o.username ?? '';
      env.NESTBOX_GIT_PASSWORD = o.password ?? '';
      pre.push('-c', 'credential.helper=', '-c', `credential.helper=${CREDENTIAL_HELPER}`);
    }
    const argv = ['git', ...pre, ...(cwd !== undefined ? ['-C', cwd] : []), ...args];
    // As Daytona's user: clones belong to it, relative paths start in its home, ~/.gitconfig is its.
    const user = (await daytonaAccount(toolbox, c.principal, c.sandboxId)).name;
    const r = await toolbox.exec(c.principal, c.sandboxId, { argv, env, user, timeoutMs: o.timeoutMs ?? 10 * 60_000 });
    if (r.exitCode !== 0 && !(r.exitCode !== null && o.okExitCodes?.includes(r.exitCode))) {
      const output = `${r.stderr}${r.stdout}`.trim();
      const { code, daytona } = classifyGitFailure(output);
      throw daemonError(r.timedOut ? 'timeout' : code, `git ${args[0]} failed: ${output || `exit ${r.exitCode ?? r.signal}`}`, daytona);
    }
    return r;
  }
  const ok = (c: ToolboxCall, status = 200) => c.res.status(status).end();
  const pathOf = (c: ToolboxCall, from: 'query' | 'body' = 'body') => str(from === 'query' ? c.req.query.path : body(c.req).path, 'path');

  router.post('/clone', tb(async (c) => {
    const b = body(c.req);
    const args = ['clone'];
    if (b.insecure_skip_tls === true) args.splice(0, 0, '-c', 'http.sslVerify=false');
    if (opt(b.branch)) args.push('--branch', opt(b.branch)!);
    if (typeof b.depth === 'number' && b.depth > 0) args.push('--depth', String(b.depth));
    const path = str(b.path, 'path');
    args.push('--', str(b.url, 'url'), path);
    await git(c, undefined, args, { username: opt(b.username), password: opt(b.password) });
    if (opt(b.commit_id)) await git(c, path, ['checkout', '--detach', opt(b.commit_id)!]);
    ok(c);
  }));
  router.get('/status', tb(async (c) => {
    const r = await git(c, pathOf(c, 'query'), ['status', '--porcelain=v1', '-b', '--untracked-files=all']);
    c.res.json(parsePorcelainStatus(r.stdout));
  }));
  router.get('/branches', tb(async (c) => {
    const path = pathOf(c, 'query');
    const r = await git(c, path, ['branch', '--list', '--format=%(refname:short)']);
    const current = (await git(c, path, ['branch', '--show-current'])).stdout.trim();
    c.res.json({ branches: r.stdout.split('\n').filter((l) => l && !l.startsWith('(')), ...(current ? { current } : {}) });
  }));
  // Like the real daemon, creating a branch also switches to it.
  router.post('/branches', tb(async (c) => {
    const b = body(c.req);
    await git(c, pathOf(c), ['checkout', '-b', str(b.name, 'name')]);
    ok(c, 201);
  }));
  router.delete('/branches', tb(async (c) => {
    const b = body(c.req);
    await git(c, pathOf(c), ['branch', '-D', str(b.name, 'name')]);
    ok(c, 204);
  }));
  router.post('/checkout', tb(async (c) => {
    const b = body(c.req);
    await git(c, pathOf(c), ['checkout', str(b.branch, 'branch')]);
    ok(c);
  }));
  router.post('/add', tb(async (c) => {
    const files = list(body(c.req).files, 'files');
    await git(c, pathOf(c), ['add', '--', ...(files.length ? files : ['.'])]);
    ok(c);
  }));
  router.post('/commit', tb(async (c) => {
    const b = body(c.req);
    const path = pathOf(c);
    const author = str(b.author, 'author');
    const email = str(b.email, 'email');
    const args = ['-c', `user.name=${author}`, '-c', `user.email=${email}`, 'commit', '-m', str(b.message, 'message'), `--author=${author} <${email}>`];
    if (b.allow_empty === true) args.push('--allow-empty');
    await git(c, path, args);
    const hash = (await git(c, path, ['rev-parse', 'HEAD'])).stdout.trim();
    c.res.json({ hash });
  }));
  router.post('/push', tb(async (c) => {
    const b = body(c.req);
    const args = ['push'];
    if (b.set_upstream === true) args.push('--set-upstream');
    if (opt(b.remote) || opt(b.branch)) args.push(opt(b.remote) ?? 'origin');
    if (opt(b.branch)) args.push(opt(b.branch)!);
    await git(c, pathOf(c), args, { username: opt(b.username), password: opt(b.password) });
    ok(c);
  }));
  router.post('/pull', tb(async (c) => {
    const b = body(c.req);
    const args = ['pull', '--no-rebase', '--no-edit'];
    if (opt(b.remote) || opt(b.branch)) args.push(opt(b.remote) ?? 'origin');
    if (opt(b.branch)) args.push(opt(b.branch)!);
    await git(c, pathOf(c), args, { username: opt(b.username), password: opt(b.password) });
    ok(c);
  }));
  router.post('/init', tb(async (c) => {
    const b = body(c.req);
    const args = ['init'];
    if (b.bare === true) args.push('--bare');
    if (opt(b.initial_branch)) args.push(`--initial-branch=${opt(b.initial_branch)}`);
    args.push('--', pathOf(c));
    await git(c, undefined, args);
    ok(c);
  }));
  router.post('/reset', tb(async (c) => {
    const b = body(c.req);
    const mode = opt(b.mode);
    if (mode && !['soft', 'mixed', 'hard', 'merge', 'keep'].includes(mode)) throw errors.validation('mode', 'must be soft, mixed, hard, merge or keep');
    const files = list(b.files, 'files');
    const args = files.length ? ['reset', opt(b.target) ?? 'HEAD', '--', ...files] : ['reset', ...(mode ? [`--${mode}`] : []), ...(opt(b.target) ? [opt(b.target)!] : [])];
    await git(c, pathOf(c), args);
    ok(c);
  }));
  router.post('/restore', tb(async (c) => {
    const b = body(c.req);
    const files = list(b.files, 'files');
    if (!files.length) throw errors.validation('files', 'must name at least one file');
    const args = ['restore'];
    if (b.staged === true) args.push('--staged');
    // Neither flag: git's default, the working tree.
    if (b.worktree === true) args.push('--worktree');
    if (opt(b.source)) args.push(`--source=${opt(b.source)}`);
    args.push('--', ...files);
    await git(c, pathOf(c), args);
    ok(c);
  }));
  router.get('/remotes', tb(async (c) => {
    const r = await git(c, pathOf(c, 'query'), ['remote', '-v']);
    const seen = new Map<string, string>();
    for (const line of r.stdout.split('\n')) {
      const m = /^(\S+)\t(\S+) \(fetch\)$/.exec(line);
      if (m && !seen.has(m[1])) seen.set(m[1], m[2]);
    }
    c.res.json({ remotes: [...seen].map(([name, url]) => ({ name, url })) });
  }));
  router.post('/remotes', tb(async (c) => {
    const b = body(c.req);
    const path = pathOf(c);
    const name = str(b.name, 'name');
    const url = str(b.url, 'url');
    const exists = (await git(c, path, ['remote'])).stdout.split('\n').includes(name);
    if (exists && b.overwrite !== true) throw daemonError('conflict', `remote ${name} already exists`);
    await git(c, path, exists ? ['remote', 'set-url', name, url] : ['remote', 'add', ...(opt(b.fetch) ? ['-t', opt(b.fetch)!] : []), name, url]);
    ok(c, 201);
  }));
  const scopeFlag = (scope: unknown, path: string | undefined): { cwd: string | undefined; flag: string } => {
    const s = opt(scope) ?? 'global';
    if (!['global', 'local', 'system'].includes(s)) throw errors.validation('scope', 'must be global, local or system');
    if (s === 'local' && !path) throw errors.validation('path', 'is required for the local scope');
    return { cwd: s === 'local' ? path : undefined, flag: `--${s}` };
  };
  router.post('/config', tb(async (c) => {
    const b = body(c.req);
    const { cwd, flag } = scopeFlag(b.scope, opt(b.path));
    await git(c, cwd, ['config', flag, str(b.key, 'key'), typeof b.value === 'string' ? b.value : str(b.value, 'value')]);
    ok(c);
  }));
  router.get('/config', tb(async (c) => {
    const { cwd, flag } = scopeFlag(c.req.query.scope, opt(c.req.query.path));
    const r = await git(c, cwd, ['config', flag, '--get', str(c.req.query.key, 'key')], { okExitCodes: [1] });
    c.res.json(r.exitCode === 0 ? { value: r.stdout.replace(/\n$/, '') } : {});
  }));
  router.post('/config/user', tb(async (c) => {
    const b = body(c.req);
    const { cwd, flag } = scopeFlag(b.scope, opt(b.path));
    await git(c, cwd, ['config', flag, 'user.name', str(b.name, 'name')]);
    await git(c, cwd, ['config', flag, 'user.email', str(b.email, 'email')]);
    ok(c);
  }));
  // Stores the credential with git's own `store` helper (~/.git-credentials), as the real daemon does.
  router.post('/credentials', tb(async (c) => {
    const b = body(c.req);
    const protocol = opt(b.protocol) ?? 'https';
    const host = opt(b.host) ?? 'github.com';
    const input = `protocol=${protocol}\nhost=${host}\nusername=${str(b.username, 'username')}\npassword=${str(b.password, 'password')}\n\n`;
    await git(c, undefined, ['config', '--global', 'credential.helper', 'store']);
    const r = await toolbox.exec(c.principal, c.sandboxId, {
      argv: ['/bin/sh', '-c', 'printf %s "$NESTBOX_GIT_CREDENTIAL" | git credential approve'],
      env: { NESTBOX_GIT_CREDENTIAL: input },
      user: (await daytonaAccount(toolbox, c.principal, c.sandboxId)).name,
    });
    if (r.exitCode !== 0) throw daemonError('validation_failed', `storing the credential failed: ${r.stderr}`);
    ok(c);
  }));
  router.get('/history', tb(async (c) => {
    const r = await git(c, pathOf(c, 'query'), ['log', '--format=%H%x1f%an%x1f%ae%x1f%aI%x1f%s']);
    c.res.json(r.stdout.split('\n').filter(Boolean).map((l) => {
      const [hash, author, email, timestamp, message] = l.split('\x1f');
      return { hash, author, email, timestamp, message };
    }));
  }));
  return router;
}

// The file routes added on top of content/stat/list (see agent-protocol/files.ts for the wire
// contract). server.ts merges `routes` into its table, asks `matchDynamic` for paths with a
// parameter, and adds `upgradeRoutes` to its WebSocket dispatcher.
import { parseOwner } from './files-ownership.js';
import type { IncomingMessage, ServerResponse } from 'node:http';
import {
  ChmodRequest,
  ChownRequest,
  CreateWatcherRequest,
  DownloadRequest,
  FileMetadataReadRequest,
  FileMetadataWriteRequest,
  MkdirRequest,
  MoveRequest,
  ReplaceRequest,
  type CreateWatcherResponse,
  type FileMetadataReadResponse,
} from '../agent-protocol/files.js';
import { readJsonBody } from './body.js';
import { sendJson, validationFailed } from './errors.js';
import { sendDownload } from './files-download.js';
import { findPaths, parseMaxResults } from './files-find.js';
import { readMetadata, writeMetadata } from './files-metadata.js';
import { compileGlob } from './files-glob.js';
import { changeMode, changeOwner, makeDirectory, movePath, parseBooleanParam, removePath } from './files-ops.js';
import { replaceInFiles } from './files-replace.js';
import { searchFiles } from './files-search.js';
import { receiveUpload } from './files-upload.js';
import { PollingWatchers, streamWatchAsSse, streamWatchOverWebSocket, type WatchTarget } from './files-watch-streams.js';
import { parseFileMode, resolveOptionalSandboxPath, resolveSandboxPath } from './paths.js';
import { exactUpgradeRoute, type UpgradeRoute } from './websocket.js';

export interface FileRouteContext {
  req: IncomingMessage;
  res: ServerResponse;
  query: URLSearchParams;
}
export type FileRouteHandler = (context: FileRouteContext) => Promise<void>;
export type FileRouteMethods = Partial<Record<string, FileRouteHandler>>;

export interface FileRouteSettings {
  home: string;
  maxJsonBodyBytes: number;
  /** Largest multipart upload body; Infinity = no limit. */
  maxUploadBytes: number;
  /** Largest file POST /files/replace reads into memory. */
  maxReplaceFileBytes: number;
  /** The helper whose --xattr mode reads and writes file metadata (nestbox-pty). */
  metadataHelper: string;
}

export interface FileRoutes {
  routes: Record<string, FileRouteMethods>;
  /** Routes with a path parameter (`/files/watchers/{id}…`); undefined when not ours. */
  matchDynamic(pathname: string): FileRouteMethods | undefined;
  upgradeRoutes: UpgradeRoute[];
  /** Stops every polling watcher (the server is closing). */
  close(): void;
}

/** Aborts when the client hangs up before the answer is complete: long walks stop early. */
function clientGone(res: ServerResponse): AbortSignal {
  const controller = new AbortController();
  res.on('close', () => {
    if (!res.writableFinished) controller.abort();
  });
  return controller.signal;
}

function wantsEventStream(req: IncomingMessage): boolean {
  return /\btext\/event-stream\b/i.test(req.headers.accept ?? '');
}

const WATCHER_PATH = /^\/files\/watchers\/([A-Za-z0-9_-]{1,64})(\/events)?$/;

export function createFileRoutes(settings: FileRouteSettings): FileRoutes {
  const { home } = settings;
  const pollingWatchers = new PollingWatchers();

  const watchTarget = (query: URLSearchParams): WatchTarget => ({
    root: resolveOptionalSandboxPath(query.get('path'), home),
    recursive: parseBooleanParam(query.get('recursive'), 'recursive'),
  });

  const routes: Record<string, FileRouteMethods> = {
    '/files': {
      DELETE: async ({ res, query }) => {
        const path = resolveSandboxPath(query.get('path'), home);
        await removePath(path, parseBooleanParam(query.get('recursive'), 'recursive'));
        res.writeHead(204).end();
      },
    },
    '/files/mkdir': {
      POST: async ({ req, res }) => {
        const request = await readJsonBody(req, MkdirRequest, settings.maxJsonBodyBytes);
        const { created, info } = await makeDirectory(resolveSandboxPath(request.path, home), parseFileMode(request.mode), parseOwner(request.owner));
        sendJson(res, created ? 201 : 200, info);
      },
    },
    '/files/move': {
      POST: async ({ req, res }) => {
        const request = await readJsonBody(req, MoveRequest, settings.maxJsonBodyBytes);
        const from = resolveSandboxPath(request.from, home, 'from');
        const to = resolveSandboxPath(request.to, home, 'to');
        sendJson(res, 200, await movePath(from, to, request.overwrite ?? false));
      },
    },
    '/files/chmod': {
      POST: async ({ req, res }) => {
        const request = await readJsonBody(req, ChmodRequest, settings.maxJsonBodyBytes);
        const mode = parseFileMode(request.mode) as number;
        sendJson(res, 200, await changeMode(resolveSandboxPath(request.path, home), mode));
      },
    },
    '/files/chown': {
      POST: async ({ req, res }) => {
        const request = await readJsonBody(req, ChownRequest, settings.maxJsonBodyBytes);
        sendJson(res, 200, await changeOwner(resolveSandboxPath(request.path, home), request.owner, request.group));
      },
    },
    '/files/find': {
      GET: async ({ res, query }) => {
        const root = resolveOptionalSandboxPath(query.get('path'), home);
        const matcher = compileGlob(query.get('pattern'), 'pattern');
        const maxResults = parseMaxResults(query.get('maxResults'));
        const signal = clientGone(res);
        const found = await findPaths(root, matcher, maxResults, signal);
        if (!signal.aborted) sendJson(res, 200, found);
      },
    },
    '/files/search': {
      GET: async ({ res, query }) => {
        const root = resolveOptionalSandboxPath(query.get('path'), home);
        const glob = query.get('glob');
        const search = {
          query: query.get('query') ?? '',
          regex: parseBooleanParam(query.get('regex'), 'regex'),
          caseSensitive: parseBooleanParam(query.get('caseSensitive'), 'caseSensitive', true),
          glob: glob ? compileGlob(glob, 'glob') : undefined,
          maxResults: parseMaxResults(query.get('maxResults')),
        };
        if (search.query.includes('\0')) throw validationFailed('query', 'must not contain a NUL byte');
        const signal = clientGone(res);
        const found = await searchFiles(root, search, signal);
        if (!signal.aborted) sendJson(res, 200, found);
      },
    },
    '/files/replace': {
      POST: async ({ req, res }) => {
        const request = await readJsonBody(req, ReplaceRequest, settings.maxJsonBodyBytes);
        sendJson(res, 200, await replaceInFiles(request, home, settings.maxReplaceFileBytes));
      },
    },
    '/files/metadata/read': {
      POST: async ({ req, res }) => {
        const request = await readJsonBody(req, FileMetadataReadRequest, settings.maxJsonBodyBytes);
        const paths = request.paths.map((path, index) => resolveSandboxPath(path, home, `paths[${index}]`));
        const metadata = await readMetadata(settings.metadataHelper, paths);
        const body: FileMetadataReadResponse = { entries: paths.map((path, index) => ({ path, metadata: metadata[index] })) };
        sendJson(res, 200, body);
      },
    },
    '/files/metadata': {
      POST: async ({ req, res }) => {
        const request = await readJsonBody(req, FileMetadataWriteRequest, settings.maxJsonBodyBytes);
        sendJson(res, 200, await writeMetadata(settings.metadataHelper, resolveSandboxPath(request.path, home), request.set, request.replacePrefix));
      },
    },
    '/files/upload': {
      POST: async ({ req, res, query }) => {
        // `base`: where relative destinations resolve (a compat layer's user's home), else home.
        const base = query.get('base');
        if (base !== null && !base.startsWith('/')) throw validationFailed('base', 'must be an absolute path');
        const { status, body } = await receiveUpload(req, { home: base ? resolveSandboxPath(base, home, 'base') : home, maxUploadBytes: settings.maxUploadBytes, queryPath: query.get('path'), owner: parseOwner(query.get('owner')) });
        sendJson(res, status, body);
      },
    },
    '/files/download': {
      POST: async ({ req, res }) => {
        const request = await readJsonBody(req, DownloadRequest, settings.maxJsonBodyBytes);
        await sendDownload(res, request.paths, request.base ? resolveSandboxPath(request.base, home, 'base') : home);
      },
    },
    '/files/watch': {
      GET: async ({ req, res, query }) => {
        const target = watchTarget(query);
        if (!wantsEventStream(req)) {
          throw validationFailed('accept', 'GET /files/watch needs `Accept: text/event-stream` (Server-Sent Events) or a WebSocket upgrade');
        }
        await streamWatchAsSse(req, res, target);
      },
    },
    '/files/watchers': {
      POST: async ({ req, res }) => {
        const request = await readJsonBody(req, CreateWatcherRequest, settings.maxJsonBodyBytes);
        const watcherId = await pollingWatchers.create({ root: resolveSandboxPath(request.path, home), recursive: request.recursive ?? false });
        const body: CreateWatcherResponse = { watcherId };
        sendJson(res, 201, body);
      },
    },
  };

  return {
    routes,
    matchDynamic(pathname) {
      const match = WATCHER_PATH.exec(pathname);
      if (!match) return undefined;
      const [, watcherId, events] = match;
      if (events) return { GET: async ({ res }) => sendJson(res, 200, await pollingWatchers.drain(watcherId)) };
      return {
        DELETE: async ({ res }) => {
          pollingWatchers.remove(watcherId);
          res.writeHead(204).end();
        },
      };
    },
    upgradeRoutes: [exactUpgradeRoute('/files/watch', async (context) => streamWatchOverWebSocket(context, watchTarget(context.query)))],
    close: () => pollingWatchers.closeAll(),
  };
}

// Daytona's Socket.IO event stream (daytona-wave2.md §9): SDK 0.218 connects at
// `<apiUrl path>/socket.io/` (Engine.IO v4, WebSocket only) when a client is made, and
// waits for state changes on it beside its 1-s polls. Without it the SDK's reconnect timers keep
// every program alive for about three minutes after its work is done; with it, state waits are
// released by a push.
//
// Served with the `socket.io` library over core's sandbox state changes (core/sandbox-events.ts):
// - auth: the API key in the CONNECT packet (`auth.token`; the upgrade itself carries none),
//   checked like the REST API's bearer key; a refusal is a CONNECT_ERROR naming the problem;
// - rooms: a socket joins its organisation's room, or, for a key limited to some sandboxes, one
//   room per sandbox it may see, so no socket ever sees another organisation's sandboxes;
// - events: `sandbox.created` (the DTO), `sandbox.state.updated` {sandbox, oldState, newState}
//   and `sandbox.desired-state.updated` {sandbox, oldDesiredState, newDesiredState}, with
//   Daytona's state names; the SDK listens to the first two;
// - limits: an authenticated socket holds a stream slot of its key until it closes; one that
//   never authenticates is closed after CONNECT_TIMEOUT_MS.
import http from 'node:http';
import type { Duplex } from 'node:stream';
import { Server, type Socket } from 'socket.io';
import { errors, toNestboxError, type NestboxError } from '../../core/errors.js';
import { requireScope } from '../../core/services/auth.js';
import type { CompatPort } from '../../core/compat-port.js';
import type { SandboxStateChange } from '../../core/sandbox-events.js';
import type { Principal } from '../../core/types.js';
import { DAYTONA_PREFIX, publicOrigin, type DaytonaOptions } from './context.js';
import { DAYTONA_STATE, daytonaDesiredState, renderDaytonaSandbox } from './sandbox-dto.js';

/** Where the SDK opens the stream: the apiUrl's path (`/daytona/api`) + `/socket.io/`. */
export const EVENT_STREAM_PATH = `${DAYTONA_PREFIX}/api/socket.io/`;

/** A socket that has not authenticated by then is closed. */
const CONNECT_TIMEOUT_MS = 10_000;
/** How often open sockets' keys are checked again: a revoked key stops receiving events. */
const REAUTHENTICATE_INTERVAL_MS = 30_000;

interface SocketData {
  principal: Principal;
  token: string;
  /** Where the client reached us: the DTOs' toolboxProxyUrl points back through the same door. */
  origin: string;
}

export function isEventStreamPath(pathname: string): boolean {
  return pathname === EVENT_STREAM_PATH || pathname === EVENT_STREAM_PATH.slice(0, -1);
}

/**
 * What is wrong with an upgrade's query for this stream, checked before Engine.IO sees it (whose
 * own refusals are not in Daytona's error shape): Engine.IO v4 straight over a WebSocket, as
 * the SDK connects; no session id, since there is no polling session to upgrade from.
 */
export function eventStreamQueryProblem(query: URLSearchParams): NestboxError | undefined {
  if (query.get('EIO') !== '4') return errors.validation('EIO', 'must be 4 (Engine.IO v4)');
  if (query.get('transport') !== 'websocket') return errors.validation('transport', 'must be websocket (no HTTP long-polling)');
  if (query.has('sid')) return errors.validation('sid', 'must not be given: there is no polling session to upgrade');
  return undefined;
}

const organisationRoom = (organizationId: string) => `org:${organizationId}`;
const sandboxRoom = (organizationId: string, sandboxId: string) => `org:${organizationId}:sandbox:${sandboxId}`;

export interface DaytonaEventStream {
  /** Hands an upgrade of EVENT_STREAM_PATH to Engine.IO (which answers a malformed one with 400). */
  handleUpgrade(req: http.IncomingMessage, socket: Duplex, head: Buffer): void;
  /** Closes every socket and stops listening to core. */
  close(): Promise<void>;
}

export function createDaytonaEventStream(core: Pick<CompatPort, 'auth' | 'requestRates' | 'sandboxEvents' | 'hostRegions'>, options: Pick<DaytonaOptions, 'streams' | 'log' | 'region'>): DaytonaEventStream {
  const io = new Server<Record<string, never>, Record<string, (payload: unknown) => void>, Record<string, never>, SocketData>({
    path: EVENT_STREAM_PATH,
    transports: ['websocket'],
    serveClient: false,
    connectTimeout: CONNECT_TIMEOUT_MS,
    // Clients send only CONNECT (a key) and pongs.
    maxHttpBufferSize: 16 * 1024,
  });
  // socket.io makes its Engine.IO server when attached to an HTTP server. It is attached to one
  // that never listens, so it installs nothing on the real server: upgrades reach it only
  // through the Daytona front door's upgrade listener (websockets.ts), which claims them first.
  io.attach(http.createServer());

  io.use((socket, next) => {
    const auth = socket.handshake.auth as { token?: unknown } | undefined;
    const token = typeof auth?.token === 'string' ? auth.token : undefined;
    core.auth
      .authenticate(token)
      .then(async (principal) => {
        // A connection counts as one request (its periodic re-authentication does not).
        await core.requestRates.admit(principal, 'daytona');
        // The events carry whole sandbox DTOs (env included): the right to read sandboxes.
        requireScope(principal, 'sandboxes:read');
        // No sandbox of its own: the socket counts against its key (twice, as owner and key).
        options.streams.acquireUntilClosed({ keyId: principal.keyId, sandboxId: `daytona-events:${principal.keyId}` }, socket.conn);
        socket.data = { principal, token: token!, origin: publicOrigin(socket.request) };
        next();
      })
      .catch((err: unknown) => {
        const e = toNestboxError(err);
        // A CONNECT_ERROR the SDK records as "WebSocket connection failed: <message>" (then polls).
        next(Object.assign(new Error(e.message), { data: { statusCode: e.status, code: e.code } }));
      });
  });

  io.on('connection', (socket) => {
    const { principal } = socket.data;
    if (principal.sandboxIds) for (const id of principal.sandboxIds) void socket.join(sandboxRoom(principal.organizationId, id));
    else void socket.join(organisationRoom(principal.organizationId));
  });

  const reauthenticate = setInterval(() => {
    for (const socket of io.of('/').sockets.values()) {
      core.auth.authenticate(socket.data.token).catch(() => socket.disconnect(true));
    }
  }, REAUTHENTICATE_INTERVAL_MS);
  reauthenticate.unref();

  const deliver = async (change: SandboxStateChange): Promise<void> => {
    const { sandbox } = change;
    const rooms = io.of('/').adapter.rooms;
    if (!rooms.get(organisationRoom(sandbox.organizationId))?.size && !rooms.get(sandboxRoom(sandbox.organizationId, sandbox.id))?.size) return;
    const region = (await core.hostRegions.regionsOf([sandbox.hostId])).get(sandbox.hostId) ?? options.region;
    // Who is in the rooms once the region is known (a socket may have left meanwhile).
    const targets = new Set<string>([...(rooms.get(organisationRoom(sandbox.organizationId)) ?? []), ...(rooms.get(sandboxRoom(sandbox.organizationId, sandbox.id)) ?? [])]);
    // One DTO per origin the clients came through (toolboxProxyUrl differs per door).
    const dtos = new Map<string, Record<string, unknown>>();
    const dtoFor = (origin: string) => {
      let dto = dtos.get(origin);
      if (!dto) dtos.set(origin, (dto = renderDaytonaSandbox(sandbox, `${origin}${DAYTONA_PREFIX}/toolbox`, { full: true, region })));
      return dto;
    };
    for (const id of targets) {
      const socket: Socket<Record<string, never>, Record<string, (payload: unknown) => void>, Record<string, never>, SocketData> | undefined = io.of('/').sockets.get(id);
      if (!socket) continue;
      const dto = dtoFor(socket.data.origin);
      if (change.kind === 'created' || change.oldState === null) {
        socket.emit('sandbox.created', dto);
        continue;
      }
      socket.emit('sandbox.state.updated', { sandbox: dto, oldState: DAYTONA_STATE[change.oldState], newState: DAYTONA_STATE[change.newState] });
      const oldDesiredState = daytonaDesiredState(change.oldState);
      const newDesiredState = daytonaDesiredState(change.newState);
      if (oldDesiredState !== newDesiredState) socket.emit('sandbox.desired-state.updated', { sandbox: dto, oldDesiredState, newDesiredState });
    }
  };
  // One delivery after another: the region lookup is asynchronous, and a client must see a
  // sandbox's changes in the order they happened.
  let delivered = Promise.resolve();
  const unsubscribe = core.sandboxEvents.subscribe((change) => {
    delivered = delivered.then(() => deliver(change)).catch((err: unknown) => options.log?.warn({ err, sandboxId: change.sandbox.id }, 'a Daytona sandbox event was not delivered'));
  });

  return {
    handleUpgrade: (req, socket, head) => io.engine.handleUpgrade(req, socket, head),
    close: async () => {
      unsubscribe();
      clearInterval(reauthenticate);
      // Its HTTP server never listened: "not running" is the expected answer to closing it.
      await new Promise<void>((resolve) => {
        void io.close(() => resolve());
      });
      options.log.debug('daytona event stream closed');
    },
  };
}

// Sandbox state changes across control-plane instances that share one PostgreSQL database: the
// writing instance sends a NOTIFY in the transaction that wrote the state (PostgreSQL delivers it
// on commit, and never for a rollback), and every instance LISTENs on one connection of its own
// and publishes what others wrote on its local bus (sandbox-events.ts). The notice carries ids
// and states only (NOTIFY payloads are small); the receiver reads the row, so its subscribers
// get the sandbox as it is now. PGlite is one process: it needs none of this.
import pg from 'pg';
import type { Db, DbOrTx } from './store/db.js';
import { sandboxRepository } from './store/repositories/sandboxes.js';
import { SANDBOX_STATES, type SandboxState } from './state-machine.js';
import type { Logger } from './logger.js';
import type { SandboxStateChange, SandboxStateEvents } from './sandbox-events.js';

export const SANDBOX_STATE_CHANNEL = 'nestbox_sandbox_state';

interface Notice {
  /** The instance that wrote the change (it published it locally already). */
  from: string;
  kind: SandboxStateChange['kind'];
  id: string;
  oldState: SandboxState | null;
  newState: SandboxState;
}

const isState = (v: unknown): v is SandboxState => typeof v === 'string' && (SANDBOX_STATES as readonly string[]).includes(v);

function parseNotice(payload: string | undefined): Notice | undefined {
  try {
    const n = JSON.parse(payload ?? '') as Partial<Notice>;
    if (typeof n.from !== 'string' || typeof n.id !== 'string' || (n.kind !== 'created' && n.kind !== 'state') || !isState(n.newState) || (n.oldState !== null && !isState(n.oldState))) return undefined;
    return n as Notice;
  } catch {
    return undefined;
  }
}

export class PostgresStateFanOut {
  private client: pg.Client | undefined;
  private stopped = false;
  private retryMs = 500;
  private retryTimer: NodeJS.Timeout | undefined;

  constructor(
    private readonly connectionString: string,
    private readonly db: Db,
    private readonly events: SandboxStateEvents,
    /** This instance's id: its own notices are skipped (published locally when written). */
    private readonly instanceId: string,
    private readonly log: Logger,
  ) {}

  /** Starts listening and makes the bus notify; resolves once the first LISTEN is in place. */
  /** The deliveries in flight, chained so they publish in order. */
  private delivering: Promise<void> = Promise.resolve();

  async start(): Promise<void> {
    this.events.relay = (db, change) => this.notify(db, change);
    await this.listen();
  }

  async stop(): Promise<void> {
    this.stopped = true;
    this.events.relay = undefined;
    clearTimeout(this.retryTimer);
    await this.client?.end().catch(() => undefined);
    this.client = undefined;
  }

  private async notify(db: DbOrTx, change: SandboxStateChange): Promise<void> {
    const notice: Notice = { from: this.instanceId, kind: change.kind, id: change.sandbox.id, oldState: change.oldState, newState: change.newState };
    // A few hundred bytes, far below NOTIFY's 8000-byte limit, so this does not fail (and fail
    // the writing transaction with it) for its payload.
    await db.raw('select pg_notify(?, ?)', [SANDBOX_STATE_CHANNEL, JSON.stringify(notice)]);
  }

  private async listen(): Promise<void> {
    const client = new pg.Client({ connectionString: this.connectionString });
    this.client = client;
    // Lost connection: listen again with backoff (0.5 s doubling to 30 s); changes meanwhile are
    // missed by other instances' streams, whose clients poll beside them.
    const again = () => {
      if (this.stopped || this.client !== client) return;
      this.client = undefined;
      client.removeAllListeners();
      void client.end().catch(() => undefined);
      this.retryTimer = setTimeout(() => void this.listen().catch(() => undefined), this.retryMs);
      this.retryTimer.unref();
      this.retryMs = Math.min(this.retryMs * 2, 30_000);
    };
    client.on('error', (err) => {
      this.log.warn({ err }, 'sandbox state LISTEN connection failed; listening again');
      again();
    });
    client.on('end', again);
    client.on('notification', (message) => {
      const notice = parseNotice(message.payload);
      if (!notice || notice.from === this.instanceId) return;
      // One at a time, in the order PostgreSQL delivered them (commit order): each delivery reads
      // the row first, and two concurrent reads could publish a create after its own next change.
      this.delivering = this.delivering.then(() => this.deliver(notice));
    });
    try {
      await client.connect();
      await client.query(`LISTEN ${SANDBOX_STATE_CHANNEL}`);
      this.retryMs = 500;
    } catch (err) {
      this.log.warn({ err }, 'could not LISTEN for sandbox state changes; retrying');
      again();
    }
  }

  private async deliver(notice: Notice): Promise<void> {
    try {
      const sandbox = await sandboxRepository(this.db).findById(notice.id);
      if (sandbox) this.events.publish({ kind: notice.kind, sandbox, oldState: notice.oldState, newState: notice.newState });
    } catch (err) {
      this.log.warn({ err, sandboxId: notice.id }, 'could not read a sandbox another instance changed');
    }
  }
}

import type { Config } from './config.js';
import type { Db } from '../core/store/db.js';
import type { AuthService } from '../core/services/auth.js';
import type { HostService } from '../core/services/hosts.js';
import type { SandboxService } from '../core/services/sandboxes.js';
import type { SnapshotService } from '../core/services/snapshots.js';
import type { IdempotencyService } from '../core/services/idempotency.js';

/** Everything a front door (native, compat) may call. Built once by the server. */
export interface Services {
  config: Config;
  db: Db;
  auth: AuthService;
  hosts: HostService;
  sandboxes: SandboxService;
  snapshots: SnapshotService;
  idempotency: IdempotencyService;
  /** Master secret from which host-agent secrets are derived. */
  hostSecret: string;
  nativeSpecText: string;
  log: (message: string) => void;
}

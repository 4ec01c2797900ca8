import type { Knex } from 'knex';
import * as initial from './20261129120000_initial.js';
import * as lifecycle from './20261129130000_lifecycle.js';
import * as networking from './20261129140000_networking.js';
import * as e2b from './20261129150000_e2b.js';
import * as daytona from './20261129160000_daytona.js';
import * as quotas from './20261201100000_quotas.js';
import * as sandboxCredentials from './20261201100000_sandbox_credentials.js';
import * as images from './20261202100000_images.js';
import * as sandboxUsage from './20261203100000_sandbox_usage.js';
import * as eventsWebhooks from './20261203110000_events_webhooks.js';
import * as webhookSigning from './20261203120000_webhook_signing.js';
import * as rateLimitBuckets from './20261204110000_rate_limit_buckets.js';
import * as pendingSandboxes from './20261204130000_pending_sandboxes.js';
import * as controlPlaneSettings from './20261204130001_control_plane_settings.js';
import * as hostCapacity from './20261204120000_host_capacity.js';
import * as organizations from './20261204100000_organizations.js';
import * as orgRequestLimits from './20261205100000_org_request_limits.js';
import * as orgVolumeLimits from './20261207500000_org_volume_limits.js';
import * as hostTransfers from './20261206100000_host_transfers.js';
import * as sshAccess from './20261207200000_ssh_access.js';
import * as secrets from './20261207400000_secrets.js';
import * as volumes from './20261207100000_volumes.js';
import * as warmPool from './20261208100000_warm_pool.js';
import * as organizationWarmPools from './20261209100000_organization_warm_pools.js';

// Migrations are imported modules rather than files knex discovers at run time, so the same
// list works from TypeScript sources (tests) and compiled JavaScript (the server).
const MIGRATIONS: Record<string, Knex.Migration> = {
  '20261129120000_initial': initial,
  '20261129130000_lifecycle': lifecycle,
  '20261129140000_networking': networking,
  '20261129150000_e2b': e2b,
  '20261129160000_daytona': daytona,
  '20261201100000_quotas': quotas,
  '20261201100000_sandbox_credentials': sandboxCredentials,
  '20261202100000_images': images,
  '20261203100000_sandbox_usage': sandboxUsage,
  '20261203110000_events_webhooks': eventsWebhooks,
  '20261203120000_webhook_signing': webhookSigning,
  '20261204110000_rate_limit_buckets': rateLimitBuckets,
  '20261204130000_pending_sandboxes': pendingSandboxes,
  '20261204130001_control_plane_settings': controlPlaneSettings,
  '20261204120000_host_capacity': hostCapacity,
  '20261204100000_organizations': organizations,
  '20261205100000_org_request_limits': orgRequestLimits,
  '20261206100000_host_transfers': hostTransfers,
  '20261207200000_ssh_access': sshAccess,
  '20261207400000_secrets': secrets,
  '20261207100000_volumes': volumes,
  '20261207500000_org_volume_limits': orgVolumeLimits,
  '20261208100000_warm_pool': warmPool,
  '20261209100000_organization_warm_pools': organizationWarmPools,
};

export const migrationSource: Knex.MigrationSource<string> = {
  getMigrations: async () => Object.keys(MIGRATIONS).sort(),
  getMigrationName: (name) => name,
  getMigration: async (name) => MIGRATIONS[name],
};

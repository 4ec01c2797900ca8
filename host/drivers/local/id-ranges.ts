// Host id ranges for sandbox user namespaces: root inside a sandbox is host uid
// `base + index × size`, an unprivileged host user that owns nothing on the host, and no two
// running sandboxes (or file views) share a range, so they share no uid, no kernel keyring
// (keyrings belong to a user namespace) and cannot signal or ptrace each other.
//
// A range is claimed per launch, like a network slot: one claim file per index under
// /run/nestbox/idranges, created with O_EXCL so host agents sharing the machine never hand out
// the same index, and removed when the sandbox stops. The disk never holds shifted ids (the
// root filesystem is an idmapped mount, see nestbox-rootfs.c), so a sandbox may get another
// range at its next start: its files do not care.
import { mkdir, open, readdir, readFile, rm } from 'node:fs/promises';
import { join } from 'node:path';

/** Ids per sandbox: uid/gid 0-65535 inside, like a normal system (65534 = nobody). */
export const IDS_PER_SANDBOX = 65536;
/** Below this, host ids belong to the host's own users and services (and /etc/subuid's usual 100000+ ranges). */
export const DEFAULT_ID_BASE = 1 << 24;
export const DEFAULT_MAX_ID_RANGES = 4096;
const DEFAULT_CLAIMS_DIR = '/run/nestbox/idranges';

export interface IdRange {
  index: number;
  /** Host uid/gid of root inside the sandbox. */
  base: number;
  count: number;
}

interface IdRangeClaim {
  owner: string;
  holder: string;
}

export class IdRangeAllocator {
  constructor(
    readonly base = DEFAULT_ID_BASE,
    readonly maxRanges = DEFAULT_MAX_ID_RANGES,
    private readonly claimsDir = DEFAULT_CLAIMS_DIR,
  ) {
    if (!Number.isInteger(base) || base < IDS_PER_SANDBOX) throw new Error(`the user namespace id base must be an integer of at least ${IDS_PER_SANDBOX}, got ${base}`);
    if (base + maxRanges * IDS_PER_SANDBOX > 2 ** 32 - 2) throw new Error(`user namespace ranges from ${base} (${maxRanges} × ${IDS_PER_SANDBOX}) run past the 32-bit id space`);
  }

  rangeOf(index: number): IdRange {
    return { index, base: this.base + index * IDS_PER_SANDBOX, count: IDS_PER_SANDBOX };
  }

  /** Claims a free range for `holder` (a sandbox id, or `<id>-view`). */
  async claim(owner: string, holder: string): Promise<IdRange> {
    await mkdir(this.claimsDir, { recursive: true, mode: 0o755 });
    const taken = new Set((await this.claims()).map((claim) => claim.index));
    for (let index = 0; index < this.maxRanges; index++) {
      if (taken.has(index)) continue;
      try {
        const handle = await open(join(this.claimsDir, String(index)), 'wx', 0o644);
        try {
          await handle.writeFile(`${JSON.stringify({ owner, holder } satisfies IdRangeClaim)}\n`);
        } finally {
          await handle.close();
        }
        return this.rangeOf(index);
      } catch (error) {
        if ((error as NodeJS.ErrnoException).code === 'EEXIST') continue;
        throw error;
      }
    }
    throw new Error(`all ${this.maxRanges} user namespace id ranges are in use on this host`);
  }

  /** Releases `index` if (and only if) it is still claimed by this owner and holder. */
  async release(index: number, owner: string, holder: string): Promise<void> {
    const claim = (await this.claims()).find((entry) => entry.index === index);
    if (claim && claim.owner === owner && claim.holder === holder) await rm(join(this.claimsDir, String(index)), { force: true });
  }

  async claims(): Promise<(IdRangeClaim & { index: number })[]> {
    const names = await readdir(this.claimsDir).catch(() => [] as string[]);
    const claims: (IdRangeClaim & { index: number })[] = [];
    for (const name of names) {
      if (!/^\d+$/.test(name)) continue;
      try {
        claims.push({ ...(JSON.parse(await readFile(join(this.claimsDir, name), 'utf8')) as IdRangeClaim), index: Number(name) });
      } catch {
        // Being written right now (or torn by a crash): taken, owner unknown.
        claims.push({ owner: '', holder: '', index: Number(name) });
      }
    }
    return claims;
  }
}

// Proof that an answer comes from the real guest agent (issue 11, finding 7).
//
// The threat: a workload inside the sandbox (root there) stops or bypasses the guest agent and
// answers the host agent's requests itself — fake exec results, fake file contents, a fake
// "healthy". The host agent therefore gives each boot of each sandbox a fresh random key that
// only the agent receives (local driver: an inherited descriptor the agent reads once and
// closes; Cloud Hypervisor: `PUT /auth/key` right after the boot or restore), keeps it on the
// host side (mode 0600, beside record.json, so a restarted host agent can adopt the sandbox),
// and checks every answer:
//
//   request   x-nestbox-agent-nonce: <32 hex digits, fresh and random per request>
//   response  x-nestbox-agent-proof: hex HMAC-SHA256(key, "nestbox-agent-proof/1" NUL nonce NUL
//                                     METHOD NUL request-target NUL status)
//
// WebSocket upgrades carry the proof on the 101 (or on the refusal). The proof binds the status
// to this request (method + target, so a proof can never be replayed for another route or
// file) and to this moment (the nonce). It does not cover the body, and need not: headers and
// body travel on one connection accepted by one process, so whoever proved itself in the head
// also writes the body. To inject into a connection the real agent accepted, a workload would
// need that process's descriptors (ptrace, pidfd_getfd) — and with those it could read the key
// from the agent's memory, which no body MAC survives either. Keeping the agent out of the
// workload's reach is the other half of finding 7 (different uid/user namespace,
// PR_SET_DUMPABLE 0); this scheme is what makes a forged or replaced agent detectable.
import { createHmac, randomBytes, timingSafeEqual } from 'node:crypto';

export const AGENT_NONCE_HEADER = 'x-nestbox-agent-nonce';
export const AGENT_PROOF_HEADER = 'x-nestbox-agent-proof';
/** On `PUT /auth/key` to an agent that already has a key: MAC of the new key under the old one. */
export const AGENT_REKEY_HEADER = 'x-nestbox-agent-rekey';
/** The route on which an agent started without a key receives one (Cloud Hypervisor guests). */
export const AGENT_KEY_ROUTE = '/auth/key';

export const AGENT_KEY_BYTES = 32;
const NONCE_BYTES = 16;
const NONCE_PATTERN = /^[0-9a-f]{32}$/;
const KEY_PATTERN = /^[0-9a-f]{64}$/;
const PROOF_PATTERN = /^[0-9a-f]{64}$/;
const DOMAIN = 'nestbox-agent-proof/1';
const REKEY_DOMAIN = 'nestbox-agent-rekey/1';

/** What a proof is computed over: the request as the agent received it, and the answer's status. */
export interface ProofSubject {
  nonce: string;
  method: string;
  /** The request target exactly as sent: path and query, e.g. `/files/content?path=%2Fetc`. */
  target: string;
  status: number;
}

export function newAgentKey(): Buffer {
  return randomBytes(AGENT_KEY_BYTES);
}

export function newNonce(): string {
  return randomBytes(NONCE_BYTES).toString('hex');
}

export function isNonce(value: unknown): value is string {
  return typeof value === 'string' && NONCE_PATTERN.test(value);
}

/** The key as stored in files and sent to a VM's agent: 64 lower-case hex digits. */
export function encodeAgentKey(key: Buffer): string {
  if (key.length !== AGENT_KEY_BYTES) throw new Error(`an agent key has ${AGENT_KEY_BYTES} bytes, not ${key.length}`);
  return key.toString('hex');
}

/** Parses `encodeAgentKey` output (surrounding whitespace allowed); undefined when malformed. */
export function decodeAgentKey(text: string): Buffer | undefined {
  const trimmed = text.trim();
  return KEY_PATTERN.test(trimmed) ? Buffer.from(trimmed, 'hex') : undefined;
}

export function agentProof(key: Buffer, subject: ProofSubject): string {
  // NUL cannot occur in a method, a request target or a hex nonce, so the fields cannot run
  // into each other.
  return createHmac('sha256', key)
    .update(`${DOMAIN}\0${subject.nonce}\0${subject.method.toUpperCase()}\0${subject.target}\0${subject.status}`)
    .digest('hex');
}

/** Constant-time check of a proof header; false for a missing or malformed one. */
export function verifyAgentProof(key: Buffer, subject: ProofSubject, given: string | string[] | undefined): boolean {
  if (typeof given !== 'string' || !PROOF_PATTERN.test(given)) return false;
  return timingSafeEqual(Buffer.from(agentProof(key, subject), 'hex'), Buffer.from(given, 'hex'));
}

/** Authorises replacing `oldKey` by `newKey` for this request (nonce): only the old key's holder can. */
export function rekeyProof(oldKey: Buffer, nonce: string, newKey: Buffer): string {
  return createHmac('sha256', oldKey).update(`${REKEY_DOMAIN}\0${nonce}\0${encodeAgentKey(newKey)}`).digest('hex');
}

export function verifyRekeyProof(oldKey: Buffer, nonce: string, newKey: Buffer, given: string | string[] | undefined): boolean {
  if (typeof given !== 'string' || !PROOF_PATTERN.test(given)) return false;
  return timingSafeEqual(Buffer.from(rekeyProof(oldKey, nonce, newKey), 'hex'), Buffer.from(given, 'hex'));
}

/**
 * The guest agent's key, which a Cloud Hypervisor guest only learns after it started: a
 * mutable holder shared by the HTTP routes and the WebSocket dispatcher.
 */
export class AgentKeyHolder {
  constructor(private current?: Buffer) {}

  get key(): Buffer | undefined {
    return this.current;
  }

  /**
   * Takes `newKey` when no key is set yet (the first claim after a boot), or when the request
   * proves it knows the current one (a restored or forked VM whose memory holds the key of the
   * boot it was snapshotted from). Returns false when refused.
   */
  replace(newKey: Buffer, nonce: string | undefined, rekeyHeader: string | string[] | undefined): boolean {
    if (this.current) {
      if (!isNonce(nonce) || !verifyRekeyProof(this.current, nonce, newKey, rekeyHeader)) return false;
    }
    this.current = newKey;
    return true;
  }

  /** The proof header value for an answer, or undefined without a key or a usable nonce. */
  proofFor(nonce: unknown, method: string | undefined, target: string | undefined, status: number): string | undefined {
    if (!this.current || !isNonce(nonce)) return undefined;
    return agentProof(this.current, { nonce, method: method ?? 'GET', target: target ?? '/', status });
  }
}

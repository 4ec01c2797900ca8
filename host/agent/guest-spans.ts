// Brings the guest agents' spans out of their sandboxes (agent-protocol/telemetry.ts): a
// sandbox cannot reach the collector, so after a traced request to its guest agent the host
// agent drains the agent's span buffer and hands the spans to `forward` (the host agent's
// exporter, src/tracing.ts). Only sandboxes that were sent a traced request are ever asked,
// once per `delayMs` at most however many requests came (the spans of requests ending in that
// time travel together); nothing runs when tracing is off (the server has no relay then).
import type { IncomingMessage } from 'node:http';
import type { Logger } from '../../core/logger.js';
import type { AgentClient } from '../agent-protocol/client.js';
import { GUEST_SPANS_ROUTE } from '../agent-protocol/telemetry.js';

export type GuestSpanSink = (otlpJson: Buffer, sandboxId: string) => Promise<void>;

/** A drain waits this long after a traced request, so the guest has ended that request's span. */
const DRAIN_DELAY_MS = 300;
/** A guest agent that does not answer a drain in this time keeps its spans for the next one. */
const DRAIN_TIMEOUT_MS = 2_000;

async function readAll(response: IncomingMessage): Promise<Buffer> {
  const chunks: Buffer[] = [];
  for await (const chunk of response) chunks.push(chunk as Buffer);
  return Buffer.concat(chunks);
}

export class GuestSpanRelay {
  private readonly pending = new Map<string, { client: AgentClient; timer: NodeJS.Timeout }>();

  constructor(
    private readonly forward: GuestSpanSink,
    private readonly log: Logger,
    private readonly delayMs = DRAIN_DELAY_MS,
  ) {}

  /** `sandboxId`'s guest agent (reached through `client`) served a traced request: drain it soon. */
  noteTraced(sandboxId: string, client: AgentClient): void {
    const pending = this.pending.get(sandboxId);
    if (pending) {
      pending.client = client;
      return;
    }
    const timer = setTimeout(() => void this.flush(sandboxId), this.delayMs);
    timer.unref();
    this.pending.set(sandboxId, { client, timer });
  }

  /** Drains `sandboxId` now if a drain is due (before the sandbox stops, pauses or goes). */
  async flush(sandboxId: string): Promise<void> {
    const pending = this.pending.get(sandboxId);
    if (!pending) return;
    clearTimeout(pending.timer);
    this.pending.delete(sandboxId);
    try {
      const response = await pending.client.request({ method: 'GET', path: GUEST_SPANS_ROUTE, timeoutMs: DRAIN_TIMEOUT_MS, signal: AbortSignal.timeout(DRAIN_TIMEOUT_MS) });
      if (response.statusCode !== 200) {
        response.resume();
        return;
      }
      await this.forward(await readAll(response), sandboxId);
    } catch (err) {
      // Spans are a diagnostic: a guest that cannot answer (stopping, frozen) loses them, never a request.
      this.log.debug({ sandboxId }, `tracing: the guest agent's spans could not be drained: ${err instanceof Error ? err.message : String(err)}`);
    }
  }

  /** Drains every sandbox with spans due (the host agent closing). */
  async close(): Promise<void> {
    await Promise.all([...this.pending.keys()].map((id) => this.flush(id)));
  }
}

import { NestboxError } from '../../../../core/errors.js';
import type { NativeHandler } from '../context.js';

/** The WebSocket itself is served in websocket.ts; a plain GET only learns how to get in. */
export const runCodeWebSocket: NativeHandler = async () => {
  throw new NestboxError('validation_failed', 'upgrade: this GET is the WebSocket form of a code run (send Upgrade: websocket); POST the run for Server-Sent Events, NDJSON or one JSON answer', { field: 'upgrade' });
};

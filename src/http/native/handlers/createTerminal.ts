import type { NativeHandler } from '../context.js';
import { forwardToAgent } from '../agent-forward.js';

interface CreateTerminalBody {
  cols?: number;
  rows?: number;
  cwd?: string;
  env?: Record<string, string>;
  shell?: string;
  user?: string;
}

/** A terminal is a detached process on a PTY running an interactive login shell. */
export const createTerminal: NativeHandler = (ctx) => {
  const body = (ctx.api.request.requestBody ?? {}) as CreateTerminalBody;
  return forwardToAgent(ctx, {
    method: 'POST',
    path: '/processes',
    operation: 'open a terminal in',
    jsonBody: {
      argv: [body.shell ?? '/bin/bash', '-l'],
      cwd: body.cwd,
      env: { TERM: 'xterm-256color', ...body.env },
      user: body.user,
      stdin: true,
      tag: 'terminal',
      pty: { cols: body.cols ?? 80, rows: body.rows ?? 24 },
    },
  });
};

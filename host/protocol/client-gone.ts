// Shared by both HTTP hops (control plane and host agent): a request whose client disappeared
// must tear down whatever upstream request it started, so nothing waits on a body or an
// answer nobody will read (the guest agent sees the disconnect: an upload's temp file is
// discarded, a foreground command is killed).
import type http from 'node:http';

/**
 * Fires when the client is gone before its answer was complete: the request was aborted
 * mid-body, or the connection closed while the response was pending.
 */
export function clientGoneSignal(req: http.IncomingMessage, res: http.ServerResponse): AbortSignal {
  const abort = new AbortController();
  const gone = () => {
    if (!res.writableFinished && !abort.signal.aborted) abort.abort(Object.assign(new Error('the client closed the connection'), { code: 'ECONNRESET' }));
  };
  res.once('close', gone);
  req.once('aborted', gone);
  return abort.signal;
}

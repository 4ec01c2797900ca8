// A shell in the sandbox on xterm.js: POST /terminals starts it at the size the fit addon
// measured, then its PTY WebSocket carries terminal bytes as binary frames both ways and JSON
// control messages as text frames (`{"type":"resize",…}` up, `{"type":"exit",…}` down).
import { useEffect, useRef, useState } from 'react';
import { Terminal } from '@xterm/xterm';
import { FitAddon } from '@xterm/addon-fit';
import '@xterm/xterm/css/xterm.css';
import { describeError, isUnauthorized } from '../session.ts';
import { useApi } from '../hooks.tsx';

export function TerminalPanel({ sandboxId, running }: { sandboxId: string; running: boolean }) {
  const api = useApi();
  const { client } = api;
  const container = useRef<HTMLDivElement>(null);
  const [status, setStatus] = useState('');
  const [attempt, setAttempt] = useState(0);

  useEffect(() => {
    if (!running || !container.current) return;
    const term = new Terminal({ cursorBlink: true, fontSize: 14, fontFamily: 'ui-monospace, "DejaVu Sans Mono", Menlo, Consolas, monospace', scrollback: 5000 });
    const fit = new FitAddon();
    term.loadAddon(fit);
    term.open(container.current);
    fit.fit();
    let ws: WebSocket | null = null;
    let disposed = false;
    const encoder = new TextEncoder();
    const send = (data: string | Uint8Array<ArrayBuffer>) => {
      if (ws?.readyState === WebSocket.OPEN) ws.send(data);
    };
    const sendSize = () => send(JSON.stringify({ type: 'resize', cols: term.cols, rows: term.rows }));

    setStatus('starting a shell…');
    void (async () => {
      try {
        const shell = await client.createTerminal(sandboxId, { cols: term.cols, rows: term.rows });
        if (disposed) return void client.killCommand(sandboxId, shell.processId).catch(() => undefined);
        ws = new WebSocket(client.terminalWebSocketUrl(sandboxId, shell.processId));
        ws.binaryType = 'arraybuffer';
        ws.onopen = () => {
          setStatus(`connected (${shell.processId})`);
          sendSize(); // the window may have changed while the shell started
          term.focus();
        };
        ws.onmessage = (event) => {
          if (typeof event.data !== 'string') return term.write(new Uint8Array(event.data as ArrayBuffer));
          const control = JSON.parse(event.data) as { type: string; exitCode?: number | null; signal?: string | null; message?: string };
          if (control.type === 'exit') setStatus(`the shell exited (${control.signal ?? `code ${control.exitCode}`})`);
          else if (control.type === 'error') setStatus(`terminal error: ${control.message}`);
        };
        ws.onclose = (event) => {
          if (!disposed) setStatus((s) => s.startsWith('the shell exited') ? s : `disconnected (${event.code}${event.reason ? `: ${event.reason}` : ''})`);
        };
      } catch (err) {
        if (isUnauthorized(err)) return api.onUnauthorized();
        if (!disposed) setStatus(`cannot start a terminal: ${describeError(err)}`);
      }
    })();

    const typed = term.onData((data) => send(encoder.encode(data)));
    const binary = term.onBinary((data) => send(Uint8Array.from(data, (c) => c.charCodeAt(0))));
    const resized = term.onResize(sendSize);
    // The panel changes size with the window and with the layout (a narrow screen, a sidebar).
    const observer = new ResizeObserver(() => fit.fit());
    observer.observe(container.current);
    const onWindowResize = () => fit.fit();
    window.addEventListener('resize', onWindowResize);
    // A reload or a closed tab runs no React cleanup: end the shell then too (best effort).
    const endShell = () => send(JSON.stringify({ type: 'kill' }));
    window.addEventListener('pagehide', endShell);
    return () => {
      disposed = true;
      window.removeEventListener('resize', onWindowResize);
      window.removeEventListener('pagehide', endShell);
      observer.disconnect();
      typed.dispose();
      binary.dispose();
      resized.dispose();
      // Leaving the page ends the shell, rather than leaving it running unattached.
      endShell();
      ws?.close();
      term.dispose();
    };
  }, [sandboxId, running, attempt, client, api]);

  if (!running) return <p className="muted">The terminal needs a running sandbox.</p>;
  return (
    <div className="terminal-panel">
      <div className="terminal-bar">
        <span className="muted">{status}</span>
        <button type="button" className="secondary" onClick={() => setAttempt((n) => n + 1)}>New shell</button>
      </div>
      <div className="terminal" ref={container} data-testid="terminal" />
    </div>
  );
}

/**
 * Reads a Server-Sent Events stream (the guest agent's process events and file watches) and
 * yields each event's `data:` payload parsed as JSON. Works on any byte stream: an
 * IncomingMessage, or a fetch body.
 */
export async function* serverSentEvents<T>(body: AsyncIterable<Uint8Array | string>): AsyncGenerator<T> {
  const decoder = new TextDecoder();
  let buffer = '';
  for await (const chunk of body) {
    buffer += typeof chunk === 'string' ? chunk : decoder.decode(chunk, { stream: true });
    let at: number;
    while ((at = buffer.indexOf('\n\n')) !== -1) {
      const block = buffer.slice(0, at);
      buffer = buffer.slice(at + 2);
      const data = block
        .split('\n')
        .filter((line) => line.startsWith('data:'))
        .map((line) => line.slice(5).trimStart())
        .join('\n');
      if (data) yield JSON.parse(data) as T;
    }
  }
}

// Splits a session shell's output stream into command output and the markers the shell prints
// between commands. A marker is `\x1e` + a per-session random prefix + a body + `\x1e`; bytes
// that might be the beginning of a marker are held back until it is clear whether they are, so
// live output is only delayed when it ends in something that looks like a marker's start.

const SEPARATOR = 0x1e;
/** A marker body is short ("S" or "E<status>"); anything longer means it was not a marker. */
const MAX_BODY = 32;

export class MarkerScanner {
  private pending = Buffer.alloc(0);

  constructor(
    /** `\x1e` + the session's random prefix. */
    private readonly prefix: Buffer,
    private readonly onOutput: (data: Buffer) => void,
    private readonly onMarker: (body: string) => void,
  ) {}

  push(data: Buffer): void {
    let buffer = this.pending.length > 0 ? Buffer.concat([this.pending, data]) : data;
    this.pending = Buffer.alloc(0);
    for (;;) {
      const at = buffer.indexOf(this.prefix);
      if (at === -1) {
        const keep = this.partialPrefixLength(buffer);
        this.emit(buffer.subarray(0, buffer.length - keep));
        this.pending = Buffer.from(buffer.subarray(buffer.length - keep));
        return;
      }
      this.emit(buffer.subarray(0, at));
      const bodyStart = at + this.prefix.length;
      const end = buffer.indexOf(SEPARATOR, bodyStart);
      if (end === -1) {
        if (buffer.length - bodyStart > MAX_BODY) {
          // Not a marker after all: let its first byte through and rescan the rest.
          this.emit(buffer.subarray(at, at + 1));
          buffer = buffer.subarray(at + 1);
          continue;
        }
        this.pending = Buffer.from(buffer.subarray(at));
        return;
      }
      this.onMarker(buffer.subarray(bodyStart, end).toString('latin1'));
      buffer = buffer.subarray(end + 1);
    }
  }

  /** Whatever is held back, for when the stream ends. */
  flush(): void {
    const rest = this.pending;
    this.pending = Buffer.alloc(0);
    this.emit(rest);
  }

  /** The length of the longest tail of `buffer` that is a proper prefix of the marker prefix. */
  private partialPrefixLength(buffer: Buffer): number {
    const longest = Math.min(this.prefix.length - 1, buffer.length);
    for (let length = longest; length > 0; length -= 1) {
      if (buffer[buffer.length - length] !== SEPARATOR) continue;
      if (buffer.subarray(buffer.length - length).equals(this.prefix.subarray(0, length))) return length;
    }
    return 0;
  }

  private emit(data: Buffer): void {
    if (data.length > 0) this.onOutput(Buffer.from(data));
  }
}

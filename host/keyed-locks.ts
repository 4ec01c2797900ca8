/**
 * Per-key serialisation for in-process work on one sandbox: a task waits for the tasks queued
 * on the same key before it, whatever their outcome. Several keys are always taken in sorted
 * order, so two multi-key tasks can never wait on each other.
 */
export class KeyedLocks {
  private readonly tails = new Map<string, Promise<unknown>>();

  run<T>(key: string, task: () => Promise<T>): Promise<T> {
    const previous = this.tails.get(key) ?? Promise.resolve();
    const next = previous.catch(() => {}).then(task);
    const settled = next.catch(() => {});
    this.tails.set(key, settled);
    void settled.then(() => {
      if (this.tails.get(key) === settled) this.tails.delete(key);
    });
    return next;
  }

  runAll<T>(keys: string[], task: () => Promise<T>): Promise<T> {
    const sorted = [...new Set(keys)].sort();
    const take = (index: number): Promise<T> => (index === sorted.length ? task() : this.run(sorted[index], () => take(index + 1)));
    return take(0);
  }

  /** Whether work is queued or running for the key. */
  busy(key: string): boolean {
    return this.tails.has(key);
  }
}

// Every detached process and session command the agent knows, by id. Ids ("p1", "p2", …) are
// never reused during the agent's lifetime. Finished processes stay for /processes/{id} and
// their output until maxFinishedProcesses newer ones have finished; then the oldest-finished is
// forgotten along with its output.
import type { ProcessInfo } from '../../agent-protocol/processes.js';
import { notFound } from '../errors.js';
import type { ManagedProcess } from './managed-process.js';

export class ProcessRegistry {
  private counter = 0;
  private readonly processes = new Map<string, ManagedProcess>();
  /** Finished ids, oldest first. */
  private readonly finished: string[] = [];

  constructor(private readonly maxFinishedProcesses: number) {}

  nextId(): string {
    this.counter += 1;
    return `p${this.counter}`;
  }

  add(process: ManagedProcess): void {
    this.processes.set(process.id, process);
    void process.ended.then(() => this.retire(process.id));
  }

  get(id: string): ManagedProcess {
    const found = this.processes.get(id);
    if (!found) throw notFound(`no such process: ${id}`);
    return found;
  }

  /** Newest first; finished ones only with `all`. */
  list(all: boolean): ProcessInfo[] {
    const chosen = [...this.processes.values()].filter((process) => all || process.running);
    return chosen.sort((a, b) => idNumber(b.id) - idNumber(a.id)).map((process) => process.info());
  }

  running(): ManagedProcess[] {
    return [...this.processes.values()].filter((process) => process.running);
  }

  private retire(id: string): void {
    this.finished.push(id);
    while (this.finished.length > this.maxFinishedProcesses) {
      this.processes.delete(this.finished.shift() as string);
    }
  }
}

function idNumber(id: string): number {
  return Number(id.slice(1));
}

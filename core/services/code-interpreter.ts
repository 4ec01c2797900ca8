// Code contexts and cells (issue 15): the engine the three front doors share. A context is one
// Jupyter kernel in the sandbox, started and driven by the guest agent (toolbox.startKernel /
// runCell); this service keeps the bookkeeping (ids, default contexts, one cell at a time per
// context, timeouts, restarts) so compat layers only translate shapes.
//
// SKELETON: the interface is final (core/code-interpreter/types.ts); the implementation lands
// with the kernel bridge.
import { NestboxError } from '../errors.js';
import type { Principal } from '../types.js';
import type {
  CodeContext,
  CodeEvent,
  CodeInterpreterPort,
  CodeLanguage,
  CreateContextInput,
  RunCodeInput,
  RunScriptInput,
  RunScriptResult,
} from '../code-interpreter/types.js';
import type { Toolbox } from './toolbox.js';

export class CodeInterpreterService implements CodeInterpreterPort {
  constructor(private readonly toolbox: Toolbox) {}

  private pending(): never {
    void this.toolbox;
    throw new NestboxError('not_supported', 'the code interpreter is being rebuilt on Jupyter kernels');
  }

  async languages(_p: Principal, _sandboxId: string): Promise<CodeLanguage[]> {
    return this.pending();
  }
  async createContext(_p: Principal, _sandboxId: string, _input: CreateContextInput): Promise<CodeContext> {
    return this.pending();
  }
  async listContexts(_p: Principal, _sandboxId: string): Promise<CodeContext[]> {
    return this.pending();
  }
  async getContext(_p: Principal, _sandboxId: string, _contextId: string): Promise<CodeContext> {
    return this.pending();
  }
  async deleteContext(_p: Principal, _sandboxId: string, _contextId: string): Promise<void> {
    return this.pending();
  }
  async restartContext(_p: Principal, _sandboxId: string, _contextId: string): Promise<CodeContext> {
    return this.pending();
  }
  async run(_p: Principal, _sandboxId: string, _input: RunCodeInput, _o?: { signal?: AbortSignal }): Promise<AsyncGenerator<CodeEvent>> {
    return this.pending();
  }
  async runScript(_p: Principal, _sandboxId: string, _input: RunScriptInput, _o?: { signal?: AbortSignal }): Promise<RunScriptResult> {
    return this.pending();
  }
}

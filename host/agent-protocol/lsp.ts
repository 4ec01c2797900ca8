// Guest-agent LSP routes: language servers run inside the sandbox, one per (languageId,
// pathToProject), spoken to by the guest agent over their stdio (JSON-RPC, vscode-jsonrpc). Like
// the other protocol files, this one is shared by the host side and the guest-agent bundle, so it
// imports nothing but zod.
//
// Conventions: JSON in and out. Errors are `{ error: { code, message } }` with core's codes:
//   validation_failed 400  a bad field, the message starts with its name; an unsupported
//                          languageId names it (`languageId: unsupported language "ruby" …`)
//   invalid_state 409      no server is running for that (languageId, pathToProject): call start
//                          first; or it has exited, or could not be started (the message says
//                          how, with the end of its stderr)
//   limit_reached 429      MAX_LANGUAGE_SERVERS are running already
//   not_supported 501      the image has no server for that language
//   timeout 504            the server did not answer within the request timeout
//   validation_failed 400  also: the server answered the request with a JSON-RPC error
//
//   POST /lsp/start        LspStartRequest → 204. Starts the server as a workload (confined like
//          every process, as `user`, cwd = the project), then initialize/initialized. Starting
//          one that runs already is a no-op 204.
//   POST /lsp/stop         LspServerRequest → 204: shutdown, exit, then SIGKILL after a grace
//          (409 when none was started).
//   POST /lsp/did-open     LspDocumentRequest → 204: the file is read from the sandbox's disk and
//          sent as textDocument/didOpen (version 1); a missing file is 404 not_found.
//   POST /lsp/did-close    LspDocumentRequest → 204
//   POST /lsp/completion   LspCompletionRequest → CompletionList (an item array is wrapped)
//   POST /lsp/document-symbols   LspDocumentRequest → { symbols: LspSymbol[] } (hierarchical
//          answers are flattened, each symbol with its location)
//   POST /lsp/workspace-symbols  LspWorkspaceSymbolsRequest → { symbols: LspSymbol[] }. A server
//          without workspace/symbol (Debian's pylsp) is answered from its textDocument/documentSymbol
//          of each source file under the project (at most MAX_WORKSPACE_SYMBOL_FILES), by name
//          substring, case-insensitive, as typescript-language-server matches.
//
// Paths: `pathToProject` and the path of a `file://` URI may be relative; they resolve against
// the sandbox user's home (the SDK's "sandbox working directory"). URIs reach the server absolute.
import { z } from 'zod';

/** Where the image keeps typescript-language-server and typescript (host/images/language-servers.ts). */
export const LANGUAGE_SERVERS_PREFIX = '/opt/nestbox/lsp';

export const LSP_LANGUAGES = ['python', 'typescript', 'javascript'] as const;
export type LspLanguage = (typeof LSP_LANGUAGES)[number];

/** Language servers one sandbox may run at once. */
export const MAX_LANGUAGE_SERVERS = 8;
/** Files a workspace-symbol search reads when the server cannot search itself. */
export const MAX_WORKSPACE_SYMBOL_FILES = 500;

const text = z.string().min(1).refine((v) => !v.includes('\0'), 'must not contain a NUL byte');

export const LspServerRequest = z
  .object({
    // Any string here: the agent answers an unsupported one with a 400 naming it.
    languageId: text,
    pathToProject: text,
  })
  .strict();
export type LspServerRequest = z.infer<typeof LspServerRequest>;

export const LspStartRequest = LspServerRequest.extend({
  /** A name from the sandbox's /etc/passwd or a uid; default: the agent's own user. */
  user: text.optional(),
}).strict();
export type LspStartRequest = z.infer<typeof LspStartRequest>;

export const LspDocumentRequest = LspServerRequest.extend({ uri: text }).strict();
export type LspDocumentRequest = z.infer<typeof LspDocumentRequest>;

export const LspPosition = z.object({ line: z.number().int().min(0), character: z.number().int().min(0) });
export type LspPosition = z.infer<typeof LspPosition>;

export const LspCompletionRequest = LspDocumentRequest.extend({
  position: LspPosition,
  context: z.object({ triggerKind: z.number().int(), triggerCharacter: z.string().optional() }).optional(),
}).strict();
export type LspCompletionRequest = z.infer<typeof LspCompletionRequest>;

export const LspWorkspaceSymbolsRequest = LspServerRequest.extend({ query: z.string() }).strict();
export type LspWorkspaceSymbolsRequest = z.infer<typeof LspWorkspaceSymbolsRequest>;

export const LspCompletionItem = z
  .object({
    label: z.string(),
    kind: z.number().int().optional(),
    detail: z.string().optional(),
    documentation: z.unknown().optional(),
    sortText: z.string().optional(),
    filterText: z.string().optional(),
    insertText: z.string().optional(),
  });
export const LspCompletionList = z.object({ isIncomplete: z.boolean(), items: z.array(LspCompletionItem) });
export type LspCompletionList = z.infer<typeof LspCompletionList>;

export const LspRange = z.object({ start: LspPosition, end: LspPosition });
export const LspSymbol = z.object({
  name: z.string(),
  kind: z.number().int(),
  location: z.object({ uri: z.string(), range: LspRange }),
  containerName: z.string().optional(),
});
export type LspSymbol = z.infer<typeof LspSymbol>;
export const LspSymbolsResponse = z.object({ symbols: z.array(LspSymbol) });
export type LspSymbolsResponse = z.infer<typeof LspSymbolsResponse>;

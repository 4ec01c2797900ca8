// operationId → handler. A test checks this table against openapi/native.yaml both ways.
import type { NativeHandler } from '../context.js';
import { createApiKey } from './createApiKey.js';
import { createSandbox } from './createSandbox.js';
import { deleteApiKey } from './deleteApiKey.js';
import { deleteSandbox } from './deleteSandbox.js';
import { downloadFile } from './downloadFile.js';
import { getHealth } from './getHealth.js';
import { getOpenApiDocument } from './getOpenApiDocument.js';
import { getSandbox } from './getSandbox.js';
import { listApiKeys } from './listApiKeys.js';
import { listFiles } from './listFiles.js';
import { listSandboxes } from './listSandboxes.js';
import { resumeSandbox } from './resumeSandbox.js';
import { runCommand } from './runCommand.js';
import { stopSandbox } from './stopSandbox.js';
import { updateSandbox } from './updateSandbox.js';
import { uploadFile } from './uploadFile.js';

export const nativeHandlers: Record<string, NativeHandler> = {
  createApiKey,
  createSandbox,
  deleteApiKey,
  deleteSandbox,
  downloadFile,
  getHealth,
  getOpenApiDocument,
  getSandbox,
  listApiKeys,
  listFiles,
  listSandboxes,
  resumeSandbox,
  runCommand,
  stopSandbox,
  updateSandbox,
  uploadFile,
};

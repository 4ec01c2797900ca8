// operationId → handler. A test checks this table against openapi/native.yaml both ways.
import type { NativeHandler } from '../context.js';
import { listSecrets } from './listSecrets.js';
import { createSecret } from './createSecret.js';
import { getSecret } from './getSecret.js';
import { updateSecret } from './updateSecret.js';
import { deleteSecret } from './deleteSecret.js';
import { updateSandboxEnv } from './updateSandboxEnv.js';
import { listHosts } from './listHosts.js';
import { getHost } from './getHost.js';
import { getWarmPool } from './getWarmPool.js';
import { cordonHost } from './cordonHost.js';
import { uncordonHost } from './uncordonHost.js';
import { drainHost } from './drainHost.js';
import { evacuateHost } from './evacuateHost.js';
import { moveSandbox } from './moveSandbox.js';
import { listImages } from './listImages.js';
import { getImage } from './getImage.js';
import { deleteImage } from './deleteImage.js';
import { tagImage } from './tagImage.js';
import { uploadBuildContext } from './uploadBuildContext.js';
import { getBuildContext } from './getBuildContext.js';
import { createBuild } from './createBuild.js';
import { pullImage } from './pullImage.js';
import { listBuilds } from './listBuilds.js';
import { getBuild } from './getBuild.js';
import { cancelBuild } from './cancelBuild.js';
import { getBuildLogs } from './getBuildLogs.js';
import { changeFileMode } from './changeFileMode.js';
import { changeFileOwner } from './changeFileOwner.js';
import { closeCommandStdin } from './closeCommandStdin.js';
import { createApiKey } from './createApiKey.js';
import { createFileWatcher } from './createFileWatcher.js';
import { createSandbox } from './createSandbox.js';
import { createSession } from './createSession.js';
import { createSnapshot } from './createSnapshot.js';
import { createVolume } from './createVolume.js';
import { deleteVolume } from './deleteVolume.js';
import { getVolume } from './getVolume.js';
import { listVolumes } from './listVolumes.js';
import { createTerminal } from './createTerminal.js';
import { deleteApiKey } from './deleteApiKey.js';
import { deleteFile } from './deleteFile.js';
import { deleteFileWatcher } from './deleteFileWatcher.js';
import { deleteSandbox } from './deleteSandbox.js';
import { deleteSession } from './deleteSession.js';
import { deleteSnapshot } from './deleteSnapshot.js';
import { downloadFile } from './downloadFile.js';
import { downloadFiles } from './downloadFiles.js';
import { findFiles } from './findFiles.js';
import { forkSandbox } from './forkSandbox.js';
import { getCommand } from './getCommand.js';
import { getCommandLogs } from './getCommandLogs.js';
import { getFileMetadata } from './getFileMetadata.js';
import { getFileWatcherEvents } from './getFileWatcherEvents.js';
import { getHealth } from './getHealth.js';
import { getOpenApiDocument } from './getOpenApiDocument.js';
import { getSandbox } from './getSandbox.js';
import { getSession } from './getSession.js';
import { getSessionCommand } from './getSessionCommand.js';
import { getSnapshot } from './getSnapshot.js';
import { getSandboxUsage } from './getSandboxUsage.js';
import { getSandboxUsageHistory } from './getSandboxUsageHistory.js';
import { keepAliveSandbox } from './keepAliveSandbox.js';
import { killCommand } from './killCommand.js';
import { listApiKeys } from './listApiKeys.js';
import { listCommands } from './listCommands.js';
import { listFiles } from './listFiles.js';
import { listPorts } from './listPorts.js';
import { listSandboxes } from './listSandboxes.js';
import { listSessions } from './listSessions.js';
import { listSnapshots } from './listSnapshots.js';
import { makeDirectory } from './makeDirectory.js';
import { moveFile } from './moveFile.js';
import { pauseSandbox } from './pauseSandbox.js';
import { publishPort } from './publishPort.js';
import { replaceInFiles } from './replaceInFiles.js';
import { setFileMetadata } from './setFileMetadata.js';
import { resizeCommandTerminal } from './resizeCommandTerminal.js';
import { resumeSandbox } from './resumeSandbox.js';
import { runCommand } from './runCommand.js';
import { runSessionCommand } from './runSessionCommand.js';
import { searchFiles } from './searchFiles.js';
import { signalCommand } from './signalCommand.js';
import { statFile } from './statFile.js';
import { stopSandbox } from './stopSandbox.js';
import { streamCommand } from './streamCommand.js';
import { unpauseSandbox } from './unpauseSandbox.js';
import { unpublishPort } from './unpublishPort.js';
import { updateSandbox } from './updateSandbox.js';
import { uploadFile } from './uploadFile.js';
import { uploadFiles } from './uploadFiles.js';
import { watchFiles } from './watchFiles.js';
import { writeCommandStdin } from './writeCommandStdin.js';
import { listCodeLanguages } from './listCodeLanguages.js';
import { createCodeContext } from './createCodeContext.js';
import { listCodeContexts } from './listCodeContexts.js';
import { getCodeContext } from './getCodeContext.js';
import { deleteCodeContext } from './deleteCodeContext.js';
import { restartCodeContext } from './restartCodeContext.js';
import { runCode } from './runCode.js';
import { runCodeWebSocket } from './runCodeWebSocket.js';
import { runCodeScript } from './runCodeScript.js';
import { listEvents } from './listEvents.js';
import { getSandboxLogs } from './getSandboxLogs.js';
import { listWebhooks } from './listWebhooks.js';
import { createWebhook } from './createWebhook.js';
import { getWebhook } from './getWebhook.js';
import { updateWebhook } from './updateWebhook.js';
import { deleteWebhook } from './deleteWebhook.js';
import { createSshAccess } from './createSshAccess.js';
import { revokeSshAccess } from './revokeSshAccess.js';
import { listSshKeys } from './listSshKeys.js';
import { addSshKey } from './addSshKey.js';
import { deleteSshKey } from './deleteSshKey.js';
import { rotateWebhookSecret } from './rotateWebhookSecret.js';
import { pingWebhook } from './pingWebhook.js';
import { listWebhookDeliveries } from './listWebhookDeliveries.js';
import { replayWebhookDelivery } from './replayWebhookDelivery.js';
import { replayWebhookEvent } from './replayWebhookEvent.js';
import { createOrganization } from './createOrganization.js';
import { listOrganizations } from './listOrganizations.js';
import { getOrganization } from './getOrganization.js';
import { updateOrganization } from './updateOrganization.js';
import { createOrganizationApiKey } from './createOrganizationApiKey.js';
import { getOrganizationUsageRecords } from './getOrganizationUsageRecords.js';
import { getOwnOrganization } from './getOwnOrganization.js';
import { getOwnOrganizationUsage } from './getOwnOrganizationUsage.js';

export const nativeHandlers: Record<string, NativeHandler> = {
  listImages,
  getImage,
  deleteImage,
  tagImage,
  uploadBuildContext,
  getBuildContext,
  createBuild,
  pullImage,
  listBuilds,
  getBuild,
  cancelBuild,
  getBuildLogs,
  changeFileMode,
  changeFileOwner,
  closeCommandStdin,
  createApiKey,
  createFileWatcher,
  createSandbox,
  createSession,
  createSnapshot,
  createTerminal,
  deleteApiKey,
  deleteFile,
  deleteFileWatcher,
  deleteSandbox,
  deleteSession,
  deleteSnapshot,
  downloadFile,
  downloadFiles,
  findFiles,
  forkSandbox,
  getCommand,
  getCommandLogs,
  getFileWatcherEvents,
  getHealth,
  getOpenApiDocument,
  getSandbox,
  getSession,
  getSessionCommand,
  getSnapshot,
  getSandboxUsage,
  getSandboxUsageHistory,
  keepAliveSandbox,
  killCommand,
  listApiKeys,
  listCommands,
  listFiles,
  listPorts,
  listSandboxes,
  listSessions,
  listSnapshots,
  makeDirectory,
  moveFile,
  pauseSandbox,
  publishPort,
  replaceInFiles,
  setFileMetadata,
  getFileMetadata,
  resizeCommandTerminal,
  resumeSandbox,
  runCommand,
  runSessionCommand,
  searchFiles,
  signalCommand,
  statFile,
  stopSandbox,
  streamCommand,
  unpauseSandbox,
  unpublishPort,
  updateSandbox,
  uploadFile,
  uploadFiles,
  watchFiles,
  writeCommandStdin,
  listCodeLanguages,
  createCodeContext,
  listCodeContexts,
  getCodeContext,
  deleteCodeContext,
  restartCodeContext,
  runCode,
  runCodeWebSocket,
  runCodeScript,
  listEvents,
  getSandboxLogs,
  listWebhooks,
  createWebhook,
  getWebhook,
  updateWebhook,
  deleteWebhook,
  createSshAccess,
  revokeSshAccess,
  listSshKeys,
  addSshKey,
  deleteSshKey,
  rotateWebhookSecret,
  pingWebhook,
  listWebhookDeliveries,
  replayWebhookDelivery,
  replayWebhookEvent,
  listHosts,
  getHost,
  getWarmPool,
  cordonHost,
  uncordonHost,
  drainHost,
  evacuateHost,
  moveSandbox,
  createOrganization,
  listOrganizations,
  getOrganization,
  updateOrganization,
  createOrganizationApiKey,
  getOrganizationUsageRecords,
  getOwnOrganization,
  getOwnOrganizationUsage,
  listSecrets,
  createSecret,
  getSecret,
  updateSecret,
  deleteSecret,
  updateSandboxEnv,
  createVolume,
  listVolumes,
  getVolume,
  deleteVolume,
};

import type { NativeHandler } from '../context.js';
import { principalOf } from '../context.js';
import type { SshPublicKey } from '../../../../core/services/ssh-access.js';

export function renderSshKey(k: SshPublicKey) {
  return { id: k.id, fingerprint: k.fingerprint, keyType: k.keyType, publicKey: k.publicKey, comment: k.comment, createdAt: k.createdAt.toISOString() };
}

export const addSshKey: NativeHandler = async (ctx) => {
  const body = ctx.api.request.requestBody as { publicKey: string; comment?: string };
  ctx.res.status(201).json(renderSshKey(await ctx.services.sshAccess.addKey(principalOf(ctx), body)));
};

import type { NativeHandler } from '../context.js';
import { principalOf } from '../context.js';
import { renderSshKey } from './addSshKey.js';

export const listSshKeys: NativeHandler = async (ctx) => {
  const keys = await ctx.services.sshAccess.listKeys(principalOf(ctx));
  ctx.res.status(200).json({ items: keys.map(renderSshKey) });
};

import type { NativeHandler } from '../context.js';

export const getHealth: NativeHandler = async ({ res, services }) => {
  res.status(200).json({ status: 'ok', hostsAvailable: await services.hosts.countAlive() });
};

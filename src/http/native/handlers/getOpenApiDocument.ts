import type { NativeHandler } from '../context.js';

export const getOpenApiDocument: NativeHandler = async ({ res, services }) => {
  res.status(200).type('application/yaml').send(services.nativeSpecText);
};

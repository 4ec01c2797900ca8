// The native shape of an organisation secret: never its value (there is no field for it).
import type { SecretRecord } from '../../../core/services/secrets.js';

export const renderSecret = (s: SecretRecord) => ({
  id: s.id,
  name: s.name,
  description: s.description,
  hosts: s.hosts,
  version: s.version,
  createdAt: s.createdAt.toISOString(),
  updatedAt: s.updatedAt.toISOString(),
});

// The cookie rules of the hosted-port proxy, on their own (the networking integration test runs
// them through a real sandbox): which names are Nestbox's, and what of a sandbox's Set-Cookie
// reaches the client in either URL form.
import { describe, expect, it } from 'vitest';
import { isNestboxCookieName, portTokenCookieName, sandboxSetCookie } from './port-proxy.js';

describe('hosted-port cookies', () => {
  it('names a token cookie per sandbox and port, and knows every Nestbox name', () => {
    expect(portTokenCookieName('abc123', 8080)).toBe('nestbox_port_abc123_8080');
    for (const name of ['nestbox_port_abc_1', 'nestbox_port_token', 'NestBox', ' nestbox_x', '__Host-nestbox_s', '__secure-NESTBOX_a']) expect(isNestboxCookieName(name), name).toBe(true);
    for (const name of ['app', 'my_nestbox', '__Host-app', 'nest', '']) expect(isNestboxCookieName(name), name).toBe(false);
  });

  it('drops Set-Cookie for Nestbox names, removes Domain, and confines Path in the path form', () => {
    const prefix = '/p/abc/8080';
    expect(sandboxSetCookie('nestbox_port_abc_8080=x; Path=/p/abc/8080/', prefix)).toBeUndefined();
    expect(sandboxSetCookie('__Host-nestbox_s=x; Path=/; Secure', prefix)).toBeUndefined();
    // A nameless cookie is judged by its value (some browsers store it under that name).
    expect(sandboxSetCookie('nestbox_port_abc_8080', prefix)).toBeUndefined();
    expect(sandboxSetCookie('app=1; Path=/; Domain=example.test; HttpOnly', prefix)).toBe('app=1; HttpOnly; Path=/p/abc/8080/');
    expect(sandboxSetCookie('app=1', prefix)).toBe('app=1; Path=/p/abc/8080/');
    expect(sandboxSetCookie('app=1; path=/p/abc/8080/deep', prefix)).toBe('app=1; path=/p/abc/8080/deep');
    expect(sandboxSetCookie('app=1; Path=/p/abc/80801', prefix)).toBe('app=1; Path=/p/abc/8080/');
    expect(sandboxSetCookie('app=nestbox-rocks; Path=/p/abc/8080', prefix)).toBe('app=nestbox-rocks; Path=/p/abc/8080');
    // Host form: the port has its own host; only Domain goes.
    expect(sandboxSetCookie('app=1; Path=/; Domain=.sandboxes.test', '')).toBe('app=1; Path=/');
    expect(sandboxSetCookie('nestbox_api=1', '')).toBeUndefined();
  });
});

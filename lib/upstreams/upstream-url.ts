/**
 * What an upstream URL may hold. The router appends each request's own path and query to the
 * URL (so does every client of the upstream: health checks, scrapes, `/tokenize`), which
 * decides what can be honoured:
 * - a path prefix (`http://ingress/vllm-a`) is joined once: `/vllm-a/v1/models`;
 * - a path ending in `/v1` is an OpenAI base URL written where a server URL belongs: joined,
 *   it would send `/v1/v1/models`, so it is refused;
 * - a query or fragment cannot be joined to a path at all (`/?x=1/v1/models`): refused;
 * - credentials (`http://user:pw@host`) are refused: the router passes each client's own
 *   `Authorization` through (vLLM's `--api-key` checks it), so a URL credential would either
 *   override every client's or be shadowed by it, and a URL is printed in logs.
 */

/**
 * Why `url` cannot serve as an upstream URL, and what to write instead (`fix`, in the options'
 * words; `url`, the URL to give, for other front ends such as a command line); `undefined` when
 * it can.
 */
export function upstreamUrlProblem(url: URL): { problem: string; fix: string; url: string; credentials: boolean } | undefined {
  const origin = `${url.protocol}//${url.host}`;
  if (url.username !== '' || url.password !== '') {
    const instead = `${origin}${bare(url.pathname)}`;
    return {
      problem: 'carries credentials (user:password@), which the router would print in logs and could not send on every client\'s behalf',
      fix: `Use \`url: '${instead}'\`; ${AUTHORIZATION} (to set one for every request, set \`req.headers.authorization\` in a middleware before the router).`,
      url: instead,
      credentials: true,
    };
  }
  if (url.search !== '' || url.hash !== '') {
    const instead = `${origin}${bare(url.pathname)}`;
    return {
      problem: `has a ${url.search !== '' ? `query (${JSON.stringify(url.search)})` : `fragment (${JSON.stringify(url.hash)})`}, which cannot be joined to a request's path`,
      fix: `Use \`url: '${instead}'\`: each request keeps its own path and query.`,
      url: instead,
      credentials: false,
    };
  }
  if (/\/v1\/?$/.test(url.pathname)) {
    const instead = `${origin}${bare(url.pathname.replace(/\/v1\/?$/, ''))}`;
    return {
      problem: `ends in /v1, an OpenAI base URL: the router keeps each request's path (/v1/chat/completions), so it would send /v1/v1/…`,
      fix: `Use the server's URL without /v1: \`url: '${instead}'\`.`,
      url: instead,
      credentials: false,
    };
  }
  return undefined;
}

/** Where an API key goes instead of a URL's user information. */
export const AUTHORIZATION = "vLLM's --api-key is checked against each client's own `Authorization: Bearer …`, which the router passes through";

/**
 * `raw` as it may be printed (a log line, an error message): the user information of a URL
 * (`user:password@`) becomes `***@`. In text that does not parse as a URL, everything after
 * `scheme://` (if any) up to the last `@` goes: a password written without percent-encoding may
 * hold `/`, `?`, `#` or a space, and a scheme may be mistyped.
 */
export function redactUrl(raw: string): string {
  let parsed: URL;
  try {
    parsed = new URL(raw);
  } catch {
    return raw.replace(/^([a-z][a-z0-9+.-]*:\/\/)?.*@/is, '$1***@');
  }
  return parsed.username === '' && parsed.password === '' ? raw : raw.replace(/^([a-z][a-z0-9+.-]*:\/\/)[^/?#]*@/i, '$1***@');
}

function bare(pathname: string): string {
  return pathname === '/' ? '' : pathname.replace(/\/$/, '');
}

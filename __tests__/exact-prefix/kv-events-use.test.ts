import { describe, expect, it } from '@jest/globals';
import { Registry } from 'prom-client';
import { dpRouter, OptionError, type Options } from '../../lib';
import { prefixAware } from '../../lib/policies/prefix-aware';

const kvUpstream = { url: 'http://127.0.0.1:8000', dataParallelSize: 2, kvEvents: { endpoint: 'tcp://127.0.0.1:5557' } };
const plain = { url: 'http://127.0.0.1:8001', name: 'plain' };

function create(options: Omit<Options, 'metrics' | 'logger'>) {
  const warnings: string[] = [];
  const router = dpRouter({ ...options, metrics: { registry: new Registry() }, logger: { warn: (message) => warnings.push(message) } });
  return { router, warnings };
}

describe('kvEvents that nothing would read', () => {
  it('refuses kvEvents with prefix-aware and no prefixAware.tokenizer, naming both', () => {
    const options = { upstreams: [plain, kvUpstream], policy: 'prefix-aware' as const };
    expect(() => create(options)).toThrow(OptionError);
    expect(() => create(options)).toThrow(
      /`prefixAware\.tokenizer` is not set, so `upstreams\[1\]\.kvEvents` would be ignored and prefix-aware would route on the approximate index\. Set it to the model's tokenizer files/,
    );
  });

  it('refuses them in setUpstreams too', async () => {
    const { router } = create({ upstreams: [plain], policy: 'prefix-aware' });
    try {
      expect(() => router.setUpstreams([plain, kvUpstream])).toThrow(/`prefixAware\.tokenizer` is not set, so `upstreams\[1\]\.kvEvents` would be ignored/);
      expect(router.endpoints().map((endpoint) => endpoint.upstream)).toEqual(['plain']);
    } finally {
      await router.close();
    }
  });

  it.each([
    ['the default policy', 'least-outstanding', undefined],
    ['a prefixAware() object', 'prefix-aware', prefixAware()],
  ])('warns once at creation when %s does not route on them', async (_, name, policy) => {
    const { router, warnings } = create({ upstreams: [kvUpstream, plain], ...(policy && { policy }) });
    try {
      expect(warnings).toEqual([
        `express-dp-router: \`upstreams[0].kvEvents\` is ignored: only \`policy: 'prefix-aware'\` (by name) with \`prefixAware.tokenizer\` routes on KV events, and this router's policy is '${name}'. Set those, or remove \`kvEvents\`.`,
      ]);
    } finally {
      await router.close();
    }
  });

  it('says nothing without kvEvents', async () => {
    const { router, warnings } = create({ upstreams: [plain], policy: 'prefix-aware' });
    await router.close();
    expect(warnings).toEqual([]);
  });
});

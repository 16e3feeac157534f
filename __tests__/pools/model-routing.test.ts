import { describe, expect, it } from '@jest/globals';
import type { IncomingMessage, ServerResponse } from 'node:http';
import { closedAfterEach, echoUpstreams, exchange, startGateway, waitFor, type EchoUpstream } from '../helpers';

const started = closedAfterEach();
const echo = echoUpstreams();

async function gateway(options: Parameters<typeof startGateway>[0]) {
  const running = await startGateway(options);
  started.push(running);
  return running;
}

const post = (url: string, body: string, path = '/v1/chat/completions') => exchange(url, { path, body });

/** vLLM's `/v1/models` with a base model and LoRA adapters, and its `/metrics` with the LoRA info gauge. */
function servesVllm(upstream: EchoUpstream, base: string, adapters: readonly string[], maxLora: number): void {
  upstream.respond = (req: IncomingMessage, res: ServerResponse) => {
    if (req.url === '/v1/models') {
      const card = (id: string, parent: string | null) => ({ id, object: 'model', created: 1, owned_by: 'vllm', root: parent ? `/adapters/${id}` : base, parent, max_model_len: parent ? null : 4096, permission: [] });
      res.writeHead(200, { 'content-type': 'application/json' });
      res.end(JSON.stringify({ object: 'list', data: [card(base, null), ...adapters.map((id) => card(id, base))] }));
      return;
    }
    if (req.url === '/metrics') {
      res.writeHead(200, { 'content-type': 'text/plain' });
      res.end(
        [
          `vllm:num_requests_running{engine="0",model_name="${base}"} 0`,
          `vllm:num_requests_running{engine="1",model_name="${base}"} 0`,
          // An older adapter set lingers with an older timestamp; the newest says max_lora.
          `vllm:lora_requests_info{max_lora="8",running_lora_adapters="",waiting_lora_adapters=""} 1.7e9`,
          `vllm:lora_requests_info{max_lora="${maxLora}",running_lora_adapters="${adapters[0]}",waiting_lora_adapters=""} 1.8e9`,
          '',
        ].join('\n'),
      );
      return;
    }
    res.writeHead(200, { 'content-type': 'application/json' });
    res.end(JSON.stringify({ rank: req.headers['x-data-parallel-rank'] }));
  };
}

describe('pools by model', () => {
  it('routes each model to the upstreams that serve it, byte for byte, and answers what no upstream serves', async () => {
    const [llama, qwen] = [await echo(), await echo()];
    const { url } = await gateway({
      upstreams: [
        { url: llama.url, name: 'llama', models: ['llama', 'shared'] },
        { url: qwen.url, name: 'qwen', models: ['qwen', 'shared'], dataParallelSize: 2 },
      ],
      policy: 'round-robin',
    });
    const body = '{ "messages" : [{"role":"user","content":"hi \\u00e9"}],\n  "model":"qwen" }';
    for (let i = 0; i < 3; i++) expect((await post(url, body)).status).toBe(200);
    expect(qwen.seen.map((seen) => seen.body.toString())).toEqual([body, body, body]);
    expect(llama.seen).toHaveLength(0);
    expect((await post(url, '{"model":"llama","prompt":"x"}', '/v1/completions')).status).toBe(200);
    expect(llama.seen).toHaveLength(1);

    const unknown = await post(url, '{"model":"mistral","messages":[]}');
    expect(unknown.status).toBe(404);
    expect(JSON.parse(unknown.body)).toEqual({ error: { message: 'The model `mistral` does not exist.', type: 'NotFoundError', param: 'model', code: 404 } });
    const missing = await post(url, '{"messages":[]}');
    expect(missing.status).toBe(400);
    expect(JSON.parse(missing.body).error).toMatchObject({ type: 'BadRequestError', param: 'model' });
    expect((await post(url, '{"model":["qwen"],"input":"x"}', '/v1/embeddings')).status).toBe(400);
    expect((await post(url, '{"model":"qwen","messages":[]', '/v1/chat/completions')).status).toBe(400);
    // A path whose body names no model goes anywhere, as before.
    expect((await post(url, '{"lora_name":"a"}', '/v1/load_lora_adapter')).status).toBe(200);
    expect(llama.seen.length + qwen.seen.length).toBe(5);
    // A name longer than any model is cut in the answer, also from a body too large to decode whole.
    for (const padding of [0, 1024 * 1024]) {
      const long = await post(url, JSON.stringify({ model: 'm'.repeat(2000), messages: [], pad: 'x'.repeat(padding) }));
      expect(long.status).toBe(404);
      expect(JSON.parse(long.body).error.message).toBe(`The model \`${'m'.repeat(256)}…\` does not exist.`);
    }

    const list = await exchange(url, { method: 'GET', path: '/v1/models', body: '' });
    expect(list.status).toBe(200);
    const parsed = JSON.parse(list.body) as { object: string; data: Array<{ id: string; object: string; owned_by: string; parent: null }> };
    expect(parsed.object).toBe('list');
    expect(parsed.data.map((card) => card.id)).toEqual(['llama', 'shared', 'qwen']);
    expect(parsed.data[0]).toMatchObject({ object: 'model', owned_by: 'vllm', parent: null });
    expect(llama.seen.length + qwen.seen.length).toBe(5);
  });

  it('changes nothing without models: bodies are not read, /v1/models is proxied', async () => {
    const upstream = await echo();
    const { url } = await gateway({ upstreams: [{ url: upstream.url }], policy: 'round-robin' });
    expect((await post(url, '{"model":"anything"')).status).toBe(200);
    expect((await post(url, '{"messages":[]}')).status).toBe(200);
    expect((await exchange(url, { method: 'GET', path: '/v1/models', body: '' })).status).toBe(200);
    expect(upstream.seen.map((seen) => seen.url)).toEqual(['/v1/chat/completions', '/v1/chat/completions', '/v1/models']);
  });

  it('sends a model no pool names to the upstreams that serve every model', async () => {
    const [pinned, open] = [await echo(), await echo()];
    const { url } = await gateway({ upstreams: [{ url: pinned.url, models: ['llama'] }, { url: open.url }] });
    expect((await post(url, '{"model":"mistral"}')).status).toBe(200);
    expect(open.seen).toHaveLength(1);
    expect(pinned.seen).toHaveLength(0);
  });

  it('retries a failed connection within the model pool', async () => {
    const [good, other] = [await echo(), await echo()];
    const { url } = await gateway({
      upstreams: [
        { url: 'http://127.0.0.1:1', name: 'down', models: ['llama'] },
        { url: good.url, name: 'good', models: ['llama'] },
        { url: other.url, name: 'other', models: ['qwen'] },
      ],
      policy: 'round-robin',
      outlierDetection: false,
    });
    for (let i = 0; i < 4; i++) expect((await post(url, '{"model":"llama","messages":[]}')).status).toBe(200);
    expect(good.seen).toHaveLength(4);
    expect(other.seen).toHaveLength(0);
  });

  it('48.17: retries a hinted request on its rank within the model pool', async () => {
    const [good, other] = [await echo(), await echo()];
    const { url } = await gateway({
      upstreams: [
        { url: 'http://127.0.0.1:1', name: 'down', models: ['llama'], dataParallelSize: 2 },
        // Serves rank 1 too, and comes first among the rest: only the pool keeps the retry off it.
        { url: other.url, name: 'other', models: ['qwen'], dataParallelSize: 2 },
        { url: good.url, name: 'good', models: ['llama'], dataParallelSize: 2 },
      ],
      hints: { trust: true },
      exposeDecision: true,
      outlierDetection: false,
    });
    for (let i = 0; i < 3; i++) {
      const answer = await exchange(url, { body: '{"model":"llama","messages":[]}', path: '/v1/chat/completions', headers: { 'x-data-parallel-rank': '1' } });
      expect(answer.status).toBe(200);
      expect(answer.headers['x-dp-router-decision']).toBe('upstream=good; rank=1; source=hint');
    }
    expect(good.seen.map((seen) => seen.rankHeaders)).toEqual([['1'], ['1'], ['1']]);
    expect(other.seen).toHaveLength(0);
  });

  it('learns models and LoRA adapters from /v1/models, and keeps an adapter on the rank that has it', async () => {
    const [base, second] = [await echo(), await echo()];
    servesVllm(base, 'llama', ['sql-lora', 'chat-lora'], 1);
    servesVllm(second, 'qwen', [], 1);
    const notices: string[] = [];
    const running = await gateway({
      upstreams: [
        { url: base.url, name: 'llama', dataParallelSize: 2, discover: { intervalMs: 50 } },
        { url: second.url, name: 'qwen', discover: { intervalMs: 50 } },
      ],
      policy: 'round-robin',
      // Routine news, at info (48.16).
      logger: { warn: () => undefined, info: (_fields, message) => notices.push(message) },
    });
    const { url } = running;
    await waitFor(() => notices.filter((line) => line.includes('/v1/models')).length === 2);
    const list = JSON.parse((await exchange(url, { method: 'GET', path: '/v1/models', body: '' })).body) as { data: Array<{ id: string; parent: string | null; root: string }> };
    expect(list.data.map(({ id, parent }) => [id, parent])).toEqual([
      ['llama', null],
      ['sql-lora', 'llama'],
      ['chat-lora', 'llama'],
      ['qwen', null],
    ]);
    expect(list.data[1].root).toBe('/adapters/sql-lora');

    const rankOf = async (model: string) => {
      const answer = await post(url, JSON.stringify({ model, messages: [] }));
      expect(answer.status).toBe(200);
      return (JSON.parse(answer.body) as { rank: string }).rank;
    };
    expect(await rankOf('qwen')).toBe('0');
    // Round-robin alone would alternate ranks 0 and 1; the adapter stays where it was loaded.
    const sql = await rankOf('sql-lora');
    for (let i = 0; i < 3; i++) expect(await rankOf('sql-lora')).toBe(sql);
    // max_lora is 1 there (the newest series): the other adapter goes to the other rank.
    const chat = await rankOf('chat-lora');
    expect(chat).not.toBe(sql);
    expect(await rankOf('sql-lora')).toBe(sql);
    expect(await rankOf('chat-lora')).toBe(chat);
    expect((await post(url, '{"model":"nope","messages":[]}')).status).toBe(404);
  });
});

/**
 * The disaggregated deployment kit (example-server/k8s/disaggregated/): the strict YAML and
 * kind checks are in __tests__/example-server/deploy.test.ts; here, that the pieces fit: the
 * gateway's --prefill and --decode name the two vLLM Services and ports, each vLLM runs the
 * connector the gateway speaks, and the example server started with the manifest's args (its
 * URLs pointed at mocks) serves a disaggregated request.
 */
import { describe, expect, it } from '@jest/globals';
import { readFileSync } from 'node:fs';
import path from 'node:path';
import { parseAllDocuments } from 'yaml';
import { parseCommandLine, type GatewaySettings } from '../../example-server/cli';
import { startExampleGateway } from '../../example-server/gateway';
import { startMockVllm } from '../../example-server/mock-vllm';
import { closedAfterEach, exchange, REPO } from '../helpers';

const DIR = 'example-server/k8s/disaggregated';
const documents = (file: string): any[] => parseAllDocuments(readFileSync(path.join(REPO, DIR, file), 'utf8'), { uniqueKeys: true }).map((document) => document.toJS());
const ofKind = (file: string, kind: string) => documents(file).find((document) => document.kind === kind);
const gatewayArgs = (): string[] => ofKind('gateway-pd.yaml', 'Deployment').spec.template.spec.containers[0].args;
const started = closedAfterEach();

describe('the disaggregated kit', () => {
  it('lists its three files', () => {
    expect(ofKind('kustomization.yaml', 'Kustomization').resources).toEqual(['vllm-prefill.yaml', 'vllm-decode.yaml', 'gateway-pd.yaml']);
  });

  it.each([
    ['vllm-prefill.yaml', 'prefill'],
    ['vllm-decode.yaml', 'decode'],
  ])('%s runs NixlConnector with 8 ranks behind the Service the gateway names for the %s leg', (file, role) => {
    const deployment = ofKind(file, 'Deployment');
    const service = ofKind(file, 'Service');
    const container = deployment.spec.template.spec.containers[0];
    const config = container.args.find((arg: string) => arg.startsWith('--kv-transfer-config='));
    expect(JSON.parse(config.slice('--kv-transfer-config='.length))).toMatchObject({ kv_connector: 'NixlConnector' });
    expect(container.args).toContain('--data-parallel-size=8');
    expect(container.resources.limits['nvidia.com/gpu']).toBe('8');
    expect(Object.entries(service.spec.selector).every(([key, value]) => deployment.spec.template.metadata.labels[key] === value)).toBe(true);
    const settings = parseCommandLine(gatewayArgs()) as GatewaySettings;
    const upstream = settings.upstreams.find((candidate) => candidate.role === role)!;
    expect(upstream.url).toBe(`http://${service.metadata.name}:${service.spec.ports[0].port}`);
    expect(upstream).toMatchObject({ startRank: 0, dataParallelSize: 8 });
    expect(upstream.ranks).toBeUndefined();
    expect(settings.disaggregation).toEqual({ connector: 'nixl' });
  });

  it('gives prefill and decode pods side channels of their own, so that they can share a node', () => {
    const port = (file: string) => ofKind(file, 'Deployment').spec.template.spec.containers[0].env.find((variable: { name: string }) => variable.name === 'VLLM_NIXL_SIDE_CHANNEL_PORT').value;
    expect(port('vllm-prefill.yaml')).not.toBe(port('vllm-decode.yaml'));
  });

  it('the example server started with the gateway args serves a disaggregated request', async () => {
    const prefill = await startMockVllm({ role: 'prefill', dataParallelSize: 8 });
    const decode = await startMockVllm({ role: 'decode', dataParallelSize: 8 });
    started.push(prefill, decode);
    const args = gatewayArgs().map((arg) => arg.replace('http://vllm-prefill:8000', prefill.url).replace('http://vllm-decode:8000', decode.url));
    const settings = parseCommandLine(args) as GatewaySettings;
    const gateway = await startExampleGateway({ ...settings, host: '127.0.0.1', port: 0, healthCheckMs: 0 });
    started.push(gateway);
    const answer = await exchange(gateway.url, { body: '{"model":"mock-model","prompt":"hello","max_tokens":2}' });
    expect(answer.status).toBe(200);
    expect(prefill.stats().requests.at(-1)!.leg).toBe('prefill');
    expect(decode.stats().requests.at(-1)!.leg).toBe('decode');
  });
});

import { describe, expect, it } from '@jest/globals';
import { offsetEndpoint, resolveKvEndpoints } from '../../../lib/exact-prefix/events/endpoints';

describe('resolveKvEndpoints', () => {
  it('offsets a tcp port by the global rank, as vLLM does, even when the ranks start above 0', () => {
    expect(resolveKvEndpoints('tcp://10.0.0.5:5557', [4, 5, 7], 'kv')).toEqual(['tcp://10.0.0.5:5561', 'tcp://10.0.0.5:5562', 'tcp://10.0.0.5:5564']);
    expect(resolveKvEndpoints('tcp://[::1]:5557', [0, 1], 'kv')).toEqual(['tcp://[::1]:5557', 'tcp://[::1]:5558']);
  });

  it('suffixes inproc endpoints and keeps rank 0 as given', () => {
    expect(resolveKvEndpoints('inproc://cache', [0, 2], 'kv')).toEqual(['inproc://cache', 'inproc://cache_dp2']);
  });

  it('takes one endpoint per served rank from an array', () => {
    expect(resolveKvEndpoints(['tcp://a:1', 'tcp://b:2'], [3, 6], 'kv')).toEqual(['tcp://a:1', 'tcp://b:2']);
  });

  it.each([
    [['tcp://a:1'], [0, 1], /lists 1 endpoints for 2 ranks/],
    ['tcp://*:5557', [0], /must name the host vLLM publishes on/],
    ['http://a:1', [0], /must name the host/],
    ['tcp://a:65535', [0, 1], /past 65535/],
    ['ipc:///tmp/kv', [0, 1], /only tcp:\/\/ and inproc:\/\//],
    [[42 as unknown as string], [0], /\[0\] must be a ZeroMQ endpoint/],
  ])('refuses %j for ranks %j with a TypeError naming the option', (endpoint, ranks, message) => {
    expect(() => resolveKvEndpoints(endpoint, ranks, 'upstreams[0].kvEvents.endpoint')).toThrow(TypeError);
    expect(() => resolveKvEndpoints(endpoint, ranks, 'upstreams[0].kvEvents.endpoint')).toThrow(message);
  });

  it('offsetEndpoint leaves rank 0 untouched whatever the scheme', () => {
    expect(offsetEndpoint('ipc:///tmp/kv', 0)).toBe('ipc:///tmp/kv');
  });
});

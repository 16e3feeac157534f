import { afterEach, describe, expect, it } from '@jest/globals';
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import request from 'supertest';
import { dpRouter, ERROR_CODES, OptionError, PolicyError } from '../lib';
import { errorBody, sendError } from '../lib/errors';

let server: Server | undefined;
afterEach(() => new Promise<void>((resolve) => (server ? server.close(() => resolve()) : resolve())));

describe('errorBody', () => {
  it("has vLLM's shape", () => {
    expect(JSON.parse(errorBody(400, 'BadRequestError', 'bad', 'x-data-parallel-rank'))).toEqual({
      error: { message: 'bad', type: 'BadRequestError', param: 'x-data-parallel-rank', code: 400 },
    });
    expect(JSON.parse(errorBody(503, 'ServiceUnavailableError', 'down')).error.param).toBeNull();
  });
});

describe('sendError', () => {
  it('answers JSON with a content length', async () => {
    server = createServer((_req, res) => sendError(res, 504, 'GatewayTimeoutError', 'slow'));
    await new Promise<void>((resolve) => server!.listen(0, '127.0.0.1', resolve));
    const response = await request(`http://127.0.0.1:${(server.address() as AddressInfo).port}`).get('/');
    expect(response.status).toBe(504);
    expect(response.headers['content-type']).toBe('application/json');
    expect(Number(response.headers['content-length'])).toBe(Buffer.byteLength(response.text));
    expect(response.body.error.type).toBe('GatewayTimeoutError');
  });

  it('cuts the connection once a response has begun, so a truncated body cannot pass for whole', async () => {
    server = createServer((_req, res) => {
      res.writeHead(200, { 'content-type': 'text/event-stream' });
      res.write('data: 1\n\n');
      setTimeout(() => sendError(res, 502, 'BadGatewayError', 'gone'), 20);
    });
    await new Promise<void>((resolve) => server!.listen(0, '127.0.0.1', resolve));
    const url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
    const response = await fetch(url);
    const reader = response.body!.getReader();
    await reader.read();
    await expect(reader.read()).rejects.toThrow();
  });
});

describe('error codes', () => {
  it('gives every thrown error a stable code to match on, OptionError included', () => {
    let thrown: unknown;
    try {
      dpRouter({ upstreams: [{ url: 'http://127.0.0.1:8000', dataParallelSize: 0 }] });
    } catch (error) {
      thrown = error;
    }
    expect(thrown).toBeInstanceOf(OptionError);
    expect(thrown).toBeInstanceOf(TypeError);
    expect(thrown).toMatchObject({ code: 'ERR_DPR_OPTION', path: 'upstreams[0].dataParallelSize' });
    expect(ERROR_CODES).toEqual({ option: 'ERR_DPR_OPTION', policy: 'ERR_DPR_POLICY' });
    expect(new PolicyError('mine', 'broke')).toMatchObject({ code: 'ERR_DPR_POLICY', policy: 'mine', message: "express-dp-router: policy 'mine' broke." });
  });
});

import { afterEach, describe, expect, it } from '@jest/globals';
import { gatewayResource, SERVICE_NAME } from '../../example-server/tracing';

describe("the example gateway's trace resource", () => {
  const saved = { OTEL_SERVICE_NAME: process.env.OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES: process.env.OTEL_RESOURCE_ATTRIBUTES };
  afterEach(() => {
    for (const [key, value] of Object.entries(saved)) {
      if (value === undefined) delete process.env[key];
      else process.env[key] = value;
    }
  });

  it('names the service express-dp-router-gateway', () => {
    delete process.env.OTEL_SERVICE_NAME;
    delete process.env.OTEL_RESOURCE_ATTRIBUTES;
    expect(SERVICE_NAME).toBe('express-dp-router-gateway');
    expect(gatewayResource().attributes['service.name']).toBe('express-dp-router-gateway');
  });

  it('takes OTEL_SERVICE_NAME over it, as OpenTelemetry SDKs do', () => {
    process.env.OTEL_SERVICE_NAME = 'gateway-eu-1';
    expect(gatewayResource().attributes['service.name']).toBe('gateway-eu-1');
  });
});

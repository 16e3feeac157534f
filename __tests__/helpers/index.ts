// The test helpers, one import away: `import { startGateway, waitFor } from './helpers'`.
// Look here before writing a new one; folder-specific fixtures stay beside their tests
// (kv-events/helpers.ts, policies/fake-endpoints.ts).
export * from './app'; // gateways and servers on 127.0.0.1:0, metric readers, allIdle
export * from './echo-upstream'; // an upstream that records and echoes every request
export * from './dnsmasq'; // a real dnsmasq on a free loopback port, records changed by SIGHUP
export * from './exchange'; // one client request that never rejects
export * from './fixtures'; // shared option sets (the seed scenario)
export * from './lifecycle'; // closedAfterEach: what a test starts is closed after it
export * from './option-error'; // thrownOptionError: the OptionError a call throws
export * from './prometheus'; // a real Prometheus server, dashboard queries
export * from './ports'; // free TCP and UDP ports below the ephemeral range, for servers told theirs before they start
export * from './process-group'; // runCommand: a README command line run as a process group, stopped by SIGTERM
export * from './raw-http';
export * from './redis'; // a real redis-server on a free loopback port, killed by PID // hostile bytes both ways over node:net
export * from './vllm'; // a mock vLLM that can be killed and restarted on its port
export * from './udp'; // datagrams sent to a port
export * from './wait'; // waitFor (events, not sleeps), sleep
export * from './relay'; // an HTTP relay between gateway and upstream that rewrites requests (strips a header)

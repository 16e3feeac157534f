/**
 * Preloaded into each gateway process of `bench:gateways` (`--import`): on SIGUSR2 it prints
 * one `PROBE {…}` line with the event-loop delay since the last signal (p50, p99, max, in ms,
 * sampled every 5 ms) and the process's `process.cpuUsage()`, then starts a new window.
 */
import { monitorEventLoopDelay } from 'node:perf_hooks';

const delay = monitorEventLoopDelay({ resolution: 5 });
delay.enable();
process.on('SIGUSR2', () => {
  const cpu = process.cpuUsage();
  const ms = (nanoseconds: number) => nanoseconds / 1e6;
  process.stdout.write(`PROBE ${JSON.stringify({ p50: ms(delay.percentile(50)), p99: ms(delay.percentile(99)), max: ms(delay.max), cpuUs: cpu.user + cpu.system })}\n`);
  delay.reset();
});

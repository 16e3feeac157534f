import { constants } from 'node:os';
import pino, { type Logger } from 'pino';
import pretty from 'pino-pretty';
import { redactUrl } from '../lib/upstreams/upstream-url';
import { parseCommandLine, USAGE, UsageError, type GatewaySettings } from './cli';
import type { RunningTracing } from './tracing';

/**
 * `npm start`: parse the command line, start tracing when asked (before express is loaded, so
 * that its instrumentation applies), start the gateway, drain on SIGINT/SIGTERM.
 */
async function main(): Promise<void> {
  let settings;
  try {
    settings = parseCommandLine(process.argv.slice(2), process.env);
  } catch (error) {
    if (!(error instanceof UsageError)) throw error;
    process.stderr.write(`express-dp-router: ${error.message}\n`);
    process.exitCode = 2;
    return;
  }
  if (settings === 'help') {
    process.stdout.write(`${USAGE}\n`);
    return;
  }
  const logger = createLogger(settings);
  let tracing: RunningTracing | undefined;
  if (settings.otlpEndpoint !== undefined) {
    const { startTracing } = await import('./tracing');
    tracing = startTracing(settings.otlpEndpoint);
  }
  // With require, not import(): under tsx an import() loads the gateway (and express) as ES
  // modules, which the OpenTelemetry instrumentations, hooking require, never see.
  // eslint-disable-next-line @typescript-eslint/no-require-imports
  const { startExampleGateway } = require('./gateway') as typeof import('./gateway');
  const gateway = await startExampleGateway(settings, logger);

  // A terminal's Ctrl-C reaches every process of the group, and npm (`npm start`, whose script
  // execs node so that a SIGTERM to npm alone reaches it) forwards it once more: copies of one
  // signal within SAME_SIGNAL_MS are one. The second signal during a drain is ignored, the
  // third forces an exit.
  let signals = 0;
  const last = new Map<NodeJS.Signals, number>();
  const shutdown = (signal: NodeJS.Signals) => {
    const now = Date.now();
    const copy = now - (last.get(signal) ?? -Infinity) < SAME_SIGNAL_MS;
    last.set(signal, now);
    if (copy) return;
    signals++;
    if (signals === 2) {
      logger.warn(`express-dp-router: ${signal} again: still draining in-flight requests (a third signal forces an exit)`);
      return;
    }
    if (signals > 2) {
      logger.warn(`express-dp-router: ${signal}: forcing an exit, in-flight requests are cut`);
      process.exit(128 + constants.signals[signal]);
    }
    logger.info(`express-dp-router: ${signal}: draining in-flight requests`);
    gateway
      .close()
      .then(() => tracing?.shutdown())
      .then(
        () => process.exit(0),
        () => process.exit(1),
      );
  };
  process.on('SIGINT', shutdown);
  process.on('SIGTERM', shutdown);
  // The listening line last: a supervisor may signal the moment it reads it, and a SIGTERM
  // that came before the handlers would kill node outright (no drain, npm exits by signal).
  logger.info({ otlpEndpoint: settings.otlpEndpoint && redactUrl(settings.otlpEndpoint) }, gateway.summary);
}

/** How close two deliveries of one signal are to be one: npm forwards what the terminal sent the whole group. */
const SAME_SIGNAL_MS = 250;

/** Pretty lines for a person at a terminal, JSON lines for a log collector. */
function createLogger(settings: GatewaySettings): Logger {
  const options = { level: settings.logLevel };
  // Synchronous, in this thread: lines written just before an exit are not lost.
  return process.stdout.isTTY ? pino(options, pretty({ colorize: true, sync: true })) : pino(options, pino.destination({ dest: 1, sync: true }));
}

main().catch((error: unknown) => {
  // An OptionError's message already names the package.
  const message = (error instanceof Error ? error.message : String(error)).replace(/^express-dp-router: /, '');
  process.stderr.write(`express-dp-router: ${message}\n`);
  process.exit(1);
});

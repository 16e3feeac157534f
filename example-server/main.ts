import { parseCommandLine, USAGE, UsageError } from './cli';
import { startExampleGateway } from './gateway';

/** `npm start`: parse the command line, start the gateway, drain on SIGINT/SIGTERM. */
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
  const gateway = await startExampleGateway(settings);
  process.stdout.write(`${gateway.summary}\n`);

  const shutdown = (signal: NodeJS.Signals) => {
    process.stdout.write(`express-dp-router: ${signal}: draining in-flight requests\n`);
    gateway.close().then(
      () => process.exit(0),
      () => process.exit(1),
    );
  };
  process.once('SIGINT', shutdown);
  process.once('SIGTERM', shutdown);
}

main().catch((error: unknown) => {
  process.stderr.write(`express-dp-router: ${error instanceof Error ? error.message : String(error)}\n`);
  process.exit(1);
});

import type { OptionError } from '../../lib';

/** The OptionError `run` throws (a test fails when it throws nothing). */
export function thrownOptionError(run: () => unknown): OptionError {
  try {
    run();
  } catch (error) {
    return error as OptionError;
  }
  throw new Error('nothing thrown');
}

/** The timing flags of the mock command and of the gateway's embedded mock, read the same way by both. */
import type { MockVllmOptions } from './types';

/** The timed-engine flags of the mock (`--speeds`, `--step-ms`, `--cpu-blocks`) and of the gateway's embedded mock (`--mock-…`). */
export interface MockTimingFlags {
  speeds?: number[];
  stepMs?: number;
  cpuBlocks?: number;
}

/** Reads `1,1,0.5,0.5`: relative speeds, each above 0 and at most 100. */
export function parseSpeeds(flag: string, raw: string): number[] {
  const speeds = raw.split(',').map((part) => (/^\d+(\.\d+)?$/.test(part.trim()) ? Number(part) : NaN));
  if (speeds.some((speed) => !(speed > 0 && speed <= 100))) throw new Error(`${flag} must be relative speeds above 0, comma-separated, such as 1,1,0.5,0.5, got ${JSON.stringify(raw)}`);
  return speeds;
}

/** The mock's options for the timing flags; `engines` ranks, `speedsFlag` named when they do not match. */
export function timedMockOptions(timing: MockTimingFlags, engines: number, speedsFlag: string): Pick<MockVllmOptions, 'scheduler' | 'cpuBlocksPerRank'> {
  const { speeds, stepMs, cpuBlocks } = timing;
  if (speeds !== undefined && speeds.length !== 1 && speeds.length !== engines) {
    throw new Error(`${speedsFlag} gives ${speeds.length} speeds for ${engines} ranks: give one per rank, or one for all`);
  }
  const timed = speeds !== undefined || stepMs !== undefined;
  return {
    ...(timed && { scheduler: { ...(speeds && { speeds: speeds.length === 1 ? speeds[0] : speeds }), ...(stepMs !== undefined && { stepMs }) } }),
    ...(cpuBlocks !== undefined && { cpuBlocksPerRank: cpuBlocks }),
  };
}

import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { seededRng } from './rng';
import { generateMooncakeTrace } from './workloads';

/** Regenerates the committed Mooncake-format fixture: `npx tsx bench/routing/make-fixture.ts`. */
const records = generateMooncakeTrace(seededRng(7), 400);
writeFileSync(join(__dirname, 'fixtures', 'mooncake-sample.jsonl'), records.map((r) => JSON.stringify(r)).join('\n') + '\n');

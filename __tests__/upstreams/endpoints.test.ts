import { describe, expect, it } from '@jest/globals';
import { EndpointTable } from '../../lib/upstreams/endpoints';
import { parseOptions } from '../../lib/options';

/** Rank 2 served by three replicas, on three servers. */
const replicasOfRankTwo = () =>
  new EndpointTable(
    parseOptions({
      upstreams: ['a', 'b', 'c'].map((name, index) => ({ url: `http://127.0.0.${index + 1}:8000`, name, dataParallelSize: 4 })),
    }).upstreams,
  );

describe('EndpointTable.leastLoadedOfRank', () => {
  it('gives the least loaded healthy replica of the rank, the first on ties', () => {
    const table = replicasOfRankTwo();
    const [a, b, c] = table.all.filter((endpoint) => endpoint.rank === 2);
    expect(table.leastLoadedOfRank(2)).toBe(a);
    a.inflight = 3;
    b.inflight = 1;
    c.inflight = 1;
    expect(table.leastLoadedOfRank(2)).toBe(b);
    b.externalLoad = 0.5;
    expect(table.leastLoadedOfRank(2)).toBe(c);
    table.setHealthy(c, false);
    expect(table.leastLoadedOfRank(2)).toBe(b);
  });

  it('leaves out the replicas `skip` names, and gives none when none is left', () => {
    const table = replicasOfRankTwo();
    const [a, b, c] = table.all.filter((endpoint) => endpoint.rank === 2);
    expect(table.leastLoadedOfRank(2, (endpoint) => endpoint === a)).toBe(b);
    expect(table.leastLoadedOfRank(2, (endpoint) => endpoint !== c)).toBe(c);
    expect(table.leastLoadedOfRank(2, () => true)).toBeUndefined();
    expect(table.leastLoadedOfRank(9)).toBeUndefined();
  });
});

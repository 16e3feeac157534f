import type { AdmissionOptions } from '../lib';
import { parseAdmission } from '../lib/admission/options';
import { redactUrl } from '../lib/upstreams/upstream-url';
import type { GatewaySettings } from './cli';

/** The library's default `peers.channel` (the gateway gives none). */
const PEERS_CHANNEL = 'dp-router:peers';

/**
 * What the start-up line says of admission (its effective limits, the library's defaults
 * included) and of the peers, or nothing when they are off. A Redis URL is shown without its
 * user information, the peers' secret never.
 */
export function servicesSummary(settings: GatewaySettings, admission: AdmissionOptions | undefined): string {
  const parts: string[] = [];
  const resolved = parseAdmission('admission', admission);
  if (resolved !== undefined) {
    const { redisUrl } = settings.admission;
    const tenants = resolved.tenantHeader === undefined ? 'one tenant' : `tenants by ${resolved.tenantHeader}`;
    const budget =
      resolved.tokensPerMinute === undefined
        ? ''
        : `, ${resolved.tokensPerMinute} tokens per minute per tenant ${redisUrl === undefined ? 'counted in this process' : `counted in Redis ${redactUrl(redisUrl)}`}`;
    parts.push(`admission: ${resolved.maxInflightPerRank} in flight per rank, then a queue of ${resolved.maxLength} (${resolved.timeoutMs} ms at most), ${tenants}${budget}`);
  }
  const peers = settings.peers;
  const { redisUrl } = settings.admission;
  if (peers?.redis === true && redisUrl !== undefined) {
    parts.push(`peers: Redis pub/sub on ${redactUrl(redisUrl)}, channel ${PEERS_CHANNEL}`);
  } else if (peers !== undefined) {
    const others = peers.dns !== undefined ? `every address of ${peers.dns.name}:${peers.dns.port}` : `${peers.addresses.length} replica address(es)`;
    parts.push(`peers: UDP ${peers.listen} with ${others}`);
  }
  return parts.map((part) => `; ${part}`).join('');
}

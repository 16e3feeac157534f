/**
 * Route receipts (docs/route-receipts.md): every request routed with a prediction gets a ticket
 * (ticket.ts); when its answer has come whole, the KV events and (for a sample) the answer's
 * usage say whether the rank chosen computed it and whether the prediction came true. One book
 * per upstream keeps the counts and verdicts (book.ts, verdict.ts); this service joins them to the
 * request path:
 *
 *   decided   the lifecycle's pick: the ticket goes on the request; one answer in `usageEvery`
 *             is to be read, a stream then asked for its usage (ask-usage.ts)
 *   claims    whether the rank header is sent: not to an upstream whose receipts say it is not
 *             honoured, probes aside
 *   answered  the forwarder's answer: a sampled one's usage read as it flows (usage-json.ts,
 *             usage-strip.ts), its receipts taken at its end and put on the request's span
 *   closed    the response of any other closed: its KV receipt taken (route-state.ts)
 *
 * Per request that costs a ticket and, at the end, a lookup or two in the exact index (a map
 * insert when its blocks are still to come); the events' apply path costs a check per stored
 * block while nothing is awaited.
 */
import type { IncomingHttpHeaders, IncomingMessage, ServerResponse } from 'node:http';
import type { MetricsConfig } from '../observe/metrics';
import type { RouterLogger } from '../observe/logger';
import type { Tracing } from '../observe/tracing';
import { isEventStreamMediaType } from '../http/media-type';
import type { Endpoint } from '../types';
import { askingUsage, mayAskUsage } from './ask-usage';
import { UpstreamBook } from './book';
import { recoveredLine, unhonouredLine, untrustedLine } from './causes';
import { joinReceiptFamilies, type ReceiptFamilies } from './metrics';
import type { ReceiptsConfig } from './options';
import { RouteTicket, type ExactGate, type ExactReceipts, type HeldBlocks } from '../policies/pick-ticket';
import { stripAskedUsage } from './usage-strip';
import { AnswerTail, lastUsage, type ReportedUsage } from './usage-json';
import type { Transition } from './verdict';
import type { Verdicts } from '../verdicts/verdicts';

/** An upstream as receipts need it. */
export interface ReceiptUpstream {
  readonly name: string;
  readonly ranks: readonly number[];
  readonly rankHeader: string;
}

/** What a request carries for receipts (the router's RouteState). */
export interface ReceiptCarrier {
  receipt: RouteTicket | undefined;
  /** The body bytes the router sends, when it holds them. */
  body: Buffer | undefined;
  readonly headers: IncomingHttpHeaders;
}

/** What the service is built from. */
export interface ReceiptsParts {
  readonly config: ReceiptsConfig;
  readonly upstreams: readonly ReceiptUpstream[];
  /** The outgoing rank header (for the log lines). */
  readonly header: string;
  readonly metrics: MetricsConfig | undefined;
  readonly logger: RouterLogger;
  readonly tracing: Tracing;
  /** Where a verdict is counted and logged with its evidence; its `minSources` is what a verdict needs. */
  readonly verdicts: Verdicts;
  /** The clock. Default: `Date.now`. */
  readonly now?: () => number;
}

/** How often awaited blocks are checked for being overdue. */
const SWEEP_MS = 1000;
/**
 * Until an upstream's answers have shown `prompt_tokens_details`, one approximate pick in this
 * many has its answer read: an engine that does not report cached tokens costs its requests
 * nothing after a few looks.
 */
const DISCOVERY_EVERY = 64;

export class Receipts implements ExactReceipts {
  private readonly config: ReceiptsConfig;
  private readonly books = new Map<string, UpstreamBook>();
  private readonly families: ReceiptFamilies | undefined;
  private readonly sweeper: NodeJS.Timeout | undefined;
  private readonly now: () => number;
  /** Upstreams with a verdict against them: while none has, a request asks no book anything. */
  private degraded = 0;
  /** Picks since the last whose answer's usage was read (one in `usageEvery`). */
  private sinceUsage = 0;
  /** Whether the rank header is sent, per endpoint and ticket (route-state.ts reads it for every request). */
  readonly claims: (endpoint: Endpoint, receipt: RouteTicket | undefined) => boolean;

  constructor(private readonly parts: ReceiptsParts) {
    const config = (this.config = parts.config);
    this.now = parts.now ?? Date.now;
    this.reconfigure(parts.upstreams);
    const books = this.books;
    this.claims = (endpoint, receipt) => {
      if (this.degraded === 0) return true;
      const book = books.get(endpoint.upstream);
      return book === undefined || book.verdicts.honoured || (receipt !== undefined && receipt.probe && receipt.upstream === endpoint.upstream);
    };
    if (parts.metrics !== undefined) {
      this.families = joinReceiptFamilies(parts.metrics.registry, parts.metrics.prefix, {
        endpoints: () => [...books.values()].flatMap((book) => [...book.counts.values()]),
        honoured: () => [...books.values()].map((book) => [book.name, book.verdicts.honoured ? 1 : 0] as const),
      });
    }
    if (config.kvEvents) this.sweeper = setInterval(() => this.sweep(), SWEEP_MS).unref();
  }

  /** Exact routing starts following an upstream's index: the gate it routes that upstream through. */
  follow(upstream: string, index: HeldBlocks): ExactGate {
    const book = this.books.get(upstream) ?? this.open({ name: upstream, ranks: index.ranks, rankHeader: 'local' });
    book.index = index;
    return book.gate;
  }

  /**
   * The lifecycle's pick went to `endpoint`: the request carries the exact pick's ticket
   * (`exact`); one in `usageEvery` is to have its answer's usage read, an approximate pick then
   * getting a ticket of its own (`share`: the policy's estimate), and a stream to an exactly routed
   * upstream being asked for its usage (`members`: the body as decoded).
   */
  decided(route: ReceiptCarrier, endpoint: Endpoint, exact: RouteTicket | undefined, members: Readonly<Record<string, unknown>> | undefined, share: number | undefined): void {
    // Probes are due only while a verdict stands against an upstream.
    if (this.degraded > 0) this.books.get(endpoint.upstream)?.verdicts.routed();
    const ticket = exact !== undefined && exact.upstream === endpoint.upstream && exact.rank === endpoint.rank ? exact : undefined;
    // One answer in `usageEvery` is read (a probe's always: recovery is judged on it).
    const reads = this.config.usage && ((ticket !== undefined && ticket.probe) || ++this.sinceUsage >= this.config.usageEvery);
    if (!reads) {
      if (ticket !== undefined) route.receipt = ticket;
      return;
    }
    // A stream whose client did not ask for its usage has none to read, unless it is asked here or
    // its upstream is known to force usage (read then, never asked: whether it still does is
    // learnt from each such stream; that it does, from usage on events of an asked one, usage-strip.ts).
    const streamed = members !== undefined && members.stream === true && (members.stream_options as { include_usage?: unknown } | undefined)?.include_usage !== true;
    const forces = streamed ? this.books.get(endpoint.upstream)?.forcesUsage : undefined;
    if (ticket === undefined) {
      if (share === undefined || (streamed && forces !== true) || !this.readsApproximate(endpoint.upstream)) return;
      this.sinceUsage = 0;
      const approximate = (route.receipt = new RouteTicket(endpoint.upstream, endpoint.rank, 'approximate', share, -1, false, NaN, false, undefined, 0));
      approximate.readsUsage = true;
      approximate.looksForUsage = streamed;
      return;
    }
    route.receipt = ticket;
    if (!streamed || forces === true) {
      this.sinceUsage = 0;
      ticket.readsUsage = true;
      ticket.looksForUsage = streamed;
      return;
    }
    const body = route.body;
    if (!this.config.askStreamUsage || body === undefined || !mayAskUsage(members!)) return;
    const asked = askingUsage(body);
    if (asked === undefined) return;
    this.sinceUsage = 0;
    route.body = asked;
    if (route.headers['transfer-encoding'] === undefined) route.headers['content-length'] = String(asked.length);
    ticket.askedUsage = ticket.readsUsage = true;
  }

  /** Whether an approximate pick's answer is read: from an upstream known to report cached tokens, or now and then until it is known to. */
  private readsApproximate(upstream: string): boolean {
    const book = this.books.get(upstream);
    return book !== undefined && (book.reportsCached || ++book.looks % DISCOVERY_EVERY === 1);
  }

  /**
   * `endpoint`'s upstream began a 2xx answer to a request with `receipt`: its usage is read as it
   * flows (an asked-for usage chunk taken out of the client's stream), and the receipts are taken
   * when it ends whole.
   */
  answered(receipt: RouteTicket, endpoint: Endpoint, req: IncomingMessage, res: ServerResponse, answer: IncomingMessage): void {
    const status = answer.statusCode ?? 0;
    // A retry or a seat under admission may have moved the request off the ticket's rank.
    if (status < 200 || status >= 300 || receipt.upstream !== endpoint.upstream || receipt.rank !== endpoint.rank) return;
    const { headers } = answer;
    const book = receipt.readsUsage && (headers['content-encoding'] === undefined || headers['content-encoding'] === 'identity') ? this.books.get(receipt.upstream) : undefined;
    if (book === undefined) {
      // Nothing of the answer is read: its KV receipt waits for the response's close, which the
      // request's state watches already (no listener of its own on every answer).
      receipt.atClose = receipt.index === 'exact' && this.config.kvEvents;
      return;
    }
    let usage: ReportedUsage | undefined;
    let tail: AnswerTail | undefined;
    if (receipt.askedUsage && isEventStreamMediaType(headers['content-type'])) {
      // Its length (were one given) would count the chunk taken out. (`delete` takes V8's slow path: only when there.)
      if (headers['content-length'] !== undefined) delete headers['content-length'];
      stripAskedUsage(res, (found, forced) => {
        usage ??= found;
        if (forced) book.forcesUsage = true;
      });
    } else {
      const kept = (tail = new AnswerTail());
      answer.on('data', (chunk: Buffer) => kept.add(chunk));
    }
    answer.once('end', () => {
      if (tail !== undefined) usage = lastUsage(tail.text());
      if (receipt.looksForUsage && answer.complete) book.forcesUsage = usage !== undefined;
      this.settle(book, receipt, req, usage);
    });
  }

  /**
   * The response of a request whose answer is not read closed (route-state.ts): its KV receipt,
   * when that answer came whole. (Its span has ended: the receipt is counted, not traced.)
   */
  readonly closed = (receipt: RouteTicket, answer: IncomingMessage | null | undefined): void => {
    if (!receipt.atClose || answer?.complete !== true) return;
    const book = this.books.get(receipt.upstream);
    if (book !== undefined) book.answered(receipt, this.now(), this.config.unseenAfterMs);
  };

  /** The answer ended whole: its receipts, counted and put on the request's span. */
  private settle(book: UpstreamBook, receipt: RouteTicket, req: IncomingMessage, usage: ReportedUsage | undefined): void {
    const outcome = this.config.kvEvents && receipt.index === 'exact' ? book.answered(receipt, this.now(), this.config.unseenAfterMs) : undefined;
    const tokens = this.config.usage && usage !== undefined ? book.usage(receipt, usage) : undefined;
    if (outcome !== undefined || tokens !== undefined) this.parts.tracing.receipted(req, outcome, tokens?.predicted, tokens?.reported);
  }

  /** Follows a change of upstreams: a book for each new one, none left for one gone. */
  reconfigure(upstreams: readonly ReceiptUpstream[]): void {
    const names = new Set(upstreams.map((upstream) => upstream.name));
    for (const name of this.books.keys()) if (!names.has(name)) this.books.delete(name);
    this.degraded = [...this.books.values()].filter((one) => !one.verdicts.honoured || !one.verdicts.trusted).length;
    for (const upstream of upstreams) {
      const book = this.books.get(upstream.name);
      if (book === undefined) this.open(upstream);
      else {
        book.rankHeader = upstream.rankHeader;
        book.track(upstream.ranks);
      }
    }
  }

  /** Stops the sweep; the counts stay in the metric families. */
  close(): void {
    clearInterval(this.sweeper);
    this.families?.leave();
    for (const book of this.books.values()) book.pending.clear();
  }

  private open(upstream: ReceiptUpstream): UpstreamBook {
    const book = new UpstreamBook(upstream.name, upstream.rankHeader, upstream.ranks, { ...this.config, minSources: this.parts.verdicts.minSources }, this.told);
    this.books.set(upstream.name, book);
    return book;
  }

  private sweep(): void {
    const now = this.now();
    for (const book of this.books.values()) book.sweep(now);
  }

  /** A verdict changed: the line that says so, and why. */
  private readonly told = (book: UpstreamBook, transition: Transition): void => {
    const { logger, header, verdicts } = this.parts;
    const { probeEvery } = this.config;
    this.degraded = [...this.books.values()].filter((one) => !one.verdicts.honoured || !one.verdicts.trusted).length;
    switch (transition.kind) {
      case 'refused':
        verdicts.refused(book.name, transition.cause, { bad: transition.bad, total: transition.total, sources: transition.sources });
        return;
      case 'unhonoured':
        verdicts.taken(book.name, 'elsewhere', 'sources', { elsewhere: transition.breakdown.elsewhere, total: transition.breakdown.total, sources: transition.sources });
        logger.error({ dpRouter: { upstream: book.name, receipts: { elsewhere: transition.breakdown.elsewhere, total: transition.breakdown.total } } }, unhonouredLine(book, header, transition.breakdown, this.config.elsewhereShare, probeEvery));
        return;
      case 'untrusted':
        verdicts.taken(book.name, transition.cause, 'sources', { bad: transition.bad, total: transition.total, sources: transition.sources });
        logger.warn(untrustedLine(book, transition.cause, transition.bad, transition.total, probeEvery));
        return;
      case 'honoured':
      case 'trusted':
        logger.warn(recoveredLine(book, transition.kind));
        return;
    }
  };
}

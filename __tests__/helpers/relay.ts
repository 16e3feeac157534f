// The relay the benchmark puts between gateway and mock, shared: a proxy that strips a header, a template that drifts.
export { drifting, startRelay, stripping, type Rewrite } from '../../bench/lib/relay';

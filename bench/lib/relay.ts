// The relay lives with the tests' helpers (tests import nothing from bench/); bench:receipts
// puts the same one between its gateway and the mock.
export { drifting, startRelay, stripping, type Rewrite } from '../../__tests__/helpers/relay';
